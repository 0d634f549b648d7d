//! Request heads as our HTTP/1 server connection reads them (`server::h1::request`):
//! whatever a client sends. The connection serves a plain bodiless request itself and
//! hands anything else to hyper with the bytes untouched, so the properties are: no
//! panic, a buffer left exactly as it came unless the head was taken, a taken head that
//! says what the bytes say, and the same decision however the bytes are cut into reads.

use bytes::BytesMut;
use kamal_proxy::server::h1::request::{Parsed, parse};
use proptest::prelude::*;

const MAX_HEAD: usize = 64 * 1024;

/// What `parse` decided, comparable: the request's method, target and fields, and how
/// many bytes it took.
#[derive(Debug, PartialEq)]
enum Decision {
    Request {
        method: String,
        uri: String,
        fields: Vec<(String, Vec<u8>)>,
        keep_alive: bool,
        taken: usize,
    },
    Partial,
    Elsewhere,
}

fn decide(bytes: &[u8], max_head: usize) -> (Decision, BytesMut) {
    let mut buf = BytesMut::from(bytes);
    let decision = match parse(&mut buf, max_head) {
        Parsed::Request {
            request,
            keep_alive,
        } => Decision::Request {
            method: request.method().to_string(),
            uri: request.uri().to_string(),
            fields: request
                .headers()
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            keep_alive,
            taken: bytes.len() - buf.len(),
        },
        Parsed::Partial => Decision::Partial,
        Parsed::Elsewhere => Decision::Elsewhere,
    };
    (decision, buf)
}

fn field_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,15}".prop_filter("a field that changes who serves it", |n| {
        !matches!(
            n.as_str(),
            "te" | "expect" | "upgrade" | "content-length" | "transfer-encoding" | "connection"
        )
    })
}

fn plain_request() -> impl Strategy<Value = (String, String, Vec<(String, String)>)> {
    (
        prop::sample::select(vec!["GET", "HEAD", "DELETE", "OPTIONS", "PURGE"]),
        "/[a-zA-Z0-9/._~%-]{0,40}(\\?[a-z0-9=&]{0,20})?",
        prop::collection::vec((field_name(), "[ -~]{0,30}"), 0..12),
    )
        .prop_map(|(m, p, f)| (m.to_string(), p, f))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    #[test]
    fn arbitrary_bytes_never_panic_and_a_refused_buffer_is_untouched(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        max_head in 16usize..1024,
    ) {
        let (decision, rest) = decide(&bytes, max_head);
        match decision {
            Decision::Request { taken, .. } => {
                prop_assert!(taken > 0);
                prop_assert_eq!(&rest[..], &bytes[taken..]);
            }
            Decision::Partial | Decision::Elsewhere => prop_assert_eq!(&rest[..], &bytes[..]),
        }
    }

    #[test]
    fn a_plain_request_says_what_its_bytes_say(
        (method, path, fields) in plain_request(),
        http10 in any::<bool>(),
        trailing in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let mut raw = format!("{method} {path} {version}\r\n");
        for (n, v) in &fields {
            raw.push_str(&format!("{n}: {v}\r\n"));
        }
        raw.push_str("\r\n");
        let head_len = raw.len();
        let mut bytes = raw.into_bytes();
        bytes.extend_from_slice(&trailing);
        let (decision, rest) = decide(&bytes, MAX_HEAD);
        let Decision::Request { method: m, uri, fields: got, keep_alive, taken } = decision else {
            return Err(TestCaseError::fail(format!("not served: {decision:?}")));
        };
        prop_assert_eq!(m, method);
        prop_assert_eq!(uri, path);
        let want: Vec<(String, Vec<u8>)> = fields
            .iter()
            .map(|(n, v)| (n.clone(), v.trim_matches([' ', '\t']).as_bytes().to_vec()))
            .collect();
        // The map groups a name's values; compare as sorted lists of pairs.
        let (mut got, mut want) = (got, want);
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
        prop_assert_eq!(keep_alive, !http10);
        prop_assert_eq!(taken, head_len);
        prop_assert_eq!(&rest[..], &trailing[..]);
    }

    #[test]
    fn a_body_or_an_upgrade_goes_to_hyper_untouched(
        (method, path, fields) in plain_request(),
        special in prop::sample::select(vec![
            "Content-Length: 5",
            "Transfer-Encoding: chunked",
            "Upgrade: websocket",
            "Expect: 100-continue",
            "TE: trailers",
        ]),
        at in 0usize..12,
    ) {
        let mut lines: Vec<String> = fields.iter().map(|(n, v)| format!("{n}: {v}")).collect();
        lines.insert(at.min(lines.len()), special.to_string());
        let raw = format!("{method} {path} HTTP/1.1\r\n{}\r\n\r\nhello", lines.join("\r\n"));
        let (decision, rest) = decide(raw.as_bytes(), MAX_HEAD);
        prop_assert_eq!(decision, Decision::Elsewhere);
        prop_assert_eq!(&rest[..], raw.as_bytes());
    }

    #[test]
    fn the_decision_does_not_depend_on_how_the_bytes_arrive(
        (method, path, fields) in plain_request(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut raw = format!("{method} {path} HTTP/1.1\r\n");
        for (n, v) in &fields {
            raw.push_str(&format!("{n}: {v}\r\n"));
        }
        raw.push_str("\r\n");
        let whole = decide(raw.as_bytes(), MAX_HEAD).0;
        let cut = cut.index(raw.len());
        let part = decide(&raw.as_bytes()[..cut], MAX_HEAD).0;
        if part != Decision::Partial {
            prop_assert_eq!(part, whole);
        }
    }
}
