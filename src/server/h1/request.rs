//! A request head read into the pipeline's `Request`, when it is one our connection serves
//! itself: a plain request without a body. Anything else — a body, an upgrade, `Expect`,
//! `TE`, `CONNECT`, a head too large or malformed — is left to hyper, which then answers
//! it exactly as it would have (400, 413, 414, 431, ...).

use bytes::BytesMut;
use http::{HeaderValue, Method, Request, Uri, Version, header};
use std::mem::MaybeUninit;

use crate::proxy::body::RequestBody;
use crate::proxy::headers::has_token;

/// As hyper: more header fields than this is a 431, which hyper gives.
const MAX_HEADERS: usize = 100;
/// hyper's limit for a request target (414 past it).
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;
/// Spare room in a request's map for the fields the request path may still put in it.
const ADDED_FIELDS: usize = 8;

#[allow(clippy::large_enum_variant)] // moved once a request, never stored
pub enum Parsed {
    /// The head, taken out of the buffer; `keep_alive`: what the client asked for.
    Request {
        request: Request<RequestBody>,
        keep_alive: bool,
    },
    /// Not all of the head is in the buffer yet.
    Partial,
    /// For hyper: the buffer is untouched.
    Elsewhere,
}

/// Reads the head at the start of `buf`. `max_head`: `--max-request-header-size`.
pub fn parse(buf: &mut BytesMut, max_head: usize) -> Parsed {
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut spans = [const { MaybeUninit::<[u32; 4]>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) if len <= max_head => len,
        Ok(httparse::Status::Partial) if buf.len() <= max_head => return Parsed::Partial,
        _ => return Parsed::Elsewhere,
    };
    let (Some(method), Some(target), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Parsed::Elsewhere;
    };
    if target.len() > MAX_URI_LEN {
        return Parsed::Elsewhere;
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Elsewhere;
    };
    if method == Method::CONNECT {
        return Parsed::Elsewhere;
    }
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let mut keep_alive = version == Version::HTTP_11;
    let mut close = false;
    // Offsets rather than slices: names and values are cut out of the head's bytes once
    // it is frozen, without a copy. (A head is far below 4 GiB: `max_head` bounds it.)
    let base = buf.as_ptr() as usize;
    let at = |field: &[u8]| (field.as_ptr() as usize - base) as u32;
    let count = parsed.headers.len();
    for (field, span) in parsed.headers.iter().zip(spans.iter_mut()) {
        let name = field.name.as_bytes();
        let value = field.value;
        if !plain(name, value) {
            return Parsed::Elsewhere;
        }
        if name.eq_ignore_ascii_case(b"connection") {
            // Once any `Connection` line asks to close, a later one cannot undo it.
            if close || has_token(value, b"close") {
                close = true;
                keep_alive = false;
            } else if !keep_alive {
                keep_alive = has_token(value, b"keep-alive");
            }
        }
        let (n, v) = (at(name), at(value));
        span.write([n, n + name.len() as u32, v, v + value.len() as u32]);
    }
    let target_span = {
        let start = at(target.as_bytes()) as usize;
        start..start + target.len()
    };
    let head = buf.split_to(len).freeze();
    // hyper answers what it cannot take (400): the head goes back in front of what follows.
    let give_back = |buf: &mut BytesMut| {
        let mut back = BytesMut::with_capacity(head.len() + buf.len());
        back.extend_from_slice(&head);
        back.extend_from_slice(buf);
        *buf = back;
        Parsed::Elsewhere
    };
    let Ok(uri) = Uri::from_maybe_shared(head.slice(target_span)) else {
        return give_back(buf);
    };
    // Room for fields the pipeline may still put in the map (a `Host` when the request
    // named none, `X-Forwarded-For` from `--client-ip-header`, an id replacing an empty
    // one): a map that grows rehashes every name. The proxy's own fields leave without
    // entering it (`proxy::proxy_fields`).
    let mut headers = crate::proxy::header_maps::with_capacity(count + ADDED_FIELDS);
    for span in &spans[..count] {
        // SAFETY: the loop above wrote the first `count` spans.
        let [ns, ne, vs, ve] = unsafe { span.assume_init() }.map(|o| o as usize);
        let Ok(name) = crate::proxy::headers::name_from_wire(&head[ns..ne]) else {
            return give_back(buf);
        };
        // SAFETY: httparse accepted these bytes as a field value, and its set (HTAB, SP
        // through `~`, 0x80 and above) is the one `HeaderValue` allows.
        let value = unsafe { HeaderValue::from_maybe_shared_unchecked(head.slice(vs..ve)) };
        headers.append(name, value);
    }
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Parsed::Request {
        request: Request::from_parts(parts, RequestBody::empty()),
        keep_alive,
    }
}

/// Whether a field leaves the request one we serve: no body (`Content-Length: 0` at
/// most), no upgrade, no `Expect` or `TE`.
fn plain(name: &[u8], value: &[u8]) -> bool {
    match name.len() {
        2 => !name.eq_ignore_ascii_case(header::TE.as_str().as_bytes()),
        6 => !name.eq_ignore_ascii_case(header::EXPECT.as_str().as_bytes()),
        7 => !name.eq_ignore_ascii_case(header::UPGRADE.as_str().as_bytes()),
        14 => {
            !name.eq_ignore_ascii_case(header::CONTENT_LENGTH.as_str().as_bytes()) || value == b"0"
        }
        17 => !name.eq_ignore_ascii_case(header::TRANSFER_ENCODING.as_str().as_bytes()),
        _ => true,
    }
}
