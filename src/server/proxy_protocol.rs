//! `run --proxy-protocol` (fork F4): a load balancer in front names the client in a PROXY
//! protocol header (v1 text or v2 binary, HAProxy's spec) before the connection's first
//! HTTP or TLS byte. The header is optional per connection (the balancer's own health
//! checks send none). It is honoured only from a peer inside `--proxy-protocol-allow-ip`
//! (everyone when that is empty); from any other peer it is read and set aside and the
//! connection keeps its real address, so a spoofer gains nothing. A malformed header, or
//! one that does not arrive within the read-header timeout, closes the connection before
//! anything is forwarded.
//!
//! The header is read without reading past it: the socket is peeked until the whole
//! header is there, and exactly its bytes are then consumed, so the HTTP or TLS layer
//! gets the plain socket with nothing buffered in front of it. A connection on a listener
//! without `--proxy-protocol` never comes here.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::TcpStream;

use crate::service::gates::client_ip::IpList;

pub const V1_SIGNATURE: &[u8; 6] = b"PROXY ";
pub const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The spec's longest v1 line, CRLF included.
pub const V1_MAX: usize = 107;
/// v2's fixed part: signature, version and command, family and protocol, length.
const V2_FIXED: usize = 16;
/// The largest v2 address block (two `AF_UNIX` paths): enough to read any address.
const V2_ADDRESSES_MAX: usize = 216;
/// What is peeked at most: a whole v1 line, or v2's fixed part and addresses.
const PEEK_MAX: usize = V2_FIXED + V2_ADDRESSES_MAX;
/// How long a header may take when `--read-header-timeout` is 0 (the fork's library
/// default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the first bytes of a connection say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// No PROXY header: the connection starts with its own protocol.
    Absent,
    /// Could still be a header: more bytes are needed to tell.
    Incomplete,
    /// A whole header of `len` bytes (for v2 the whole declared length, which may run
    /// past the bytes given: TLVs that are skipped unread). `source` is the client it
    /// names, `None` for `UNKNOWN`, `LOCAL` and non-IP families.
    Header {
        len: usize,
        source: Option<SocketAddr>,
    },
    /// A header that breaks the spec.
    Invalid(&'static str),
}

/// Parses the start of a connection.
pub fn parse(bytes: &[u8]) -> Parsed {
    let Some(&first) = bytes.first() else {
        return Parsed::Incomplete;
    };
    let (signature, v1): (&[u8], bool) = match first {
        b'P' => (V1_SIGNATURE, true),
        b'\r' => (V2_SIGNATURE, false),
        _ => return Parsed::Absent,
    };
    let seen = bytes.len().min(signature.len());
    if bytes[..seen] != signature[..seen] {
        return Parsed::Absent;
    }
    if seen < signature.len() {
        return Parsed::Incomplete;
    }
    if v1 { parse_v1(bytes) } else { parse_v2(bytes) }
}

fn parse_v1(bytes: &[u8]) -> Parsed {
    let window = &bytes[..bytes.len().min(V1_MAX)];
    let Some(lf) = memchr::memchr(b'\n', window) else {
        return if bytes.len() >= V1_MAX {
            Parsed::Invalid("v1 header longer than 107 bytes")
        } else {
            Parsed::Incomplete
        };
    };
    let Some(line) = bytes[..lf].strip_suffix(b"\r") else {
        return Parsed::Invalid("v1 header not ended by CRLF");
    };
    let len = lf + 1;
    let mut fields = line[V1_SIGNATURE.len()..].split(|&b| b == b' ');
    let family = fields.next().unwrap_or_default();
    if family == b"UNKNOWN" {
        // The spec: whatever follows UNKNOWN is to be ignored.
        return Parsed::Header { len, source: None };
    }
    let v4 = match family {
        b"TCP4" => true,
        b"TCP6" => false,
        _ => return Parsed::Invalid("v1 header with an unknown protocol"),
    };
    let (Some(source), Some(destination), Some(source_port), Some(destination_port), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Parsed::Invalid("v1 header without exactly four address fields");
    };
    let address = |field: &[u8]| -> Option<IpAddr> {
        let text = std::str::from_utf8(field).ok()?;
        if v4 {
            text.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
        } else {
            text.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
        }
    };
    let (Some(source), Some(_)) = (address(source), address(destination)) else {
        return Parsed::Invalid("v1 header with an address that is not its protocol's");
    };
    let (Some(port), Some(_)) = (v1_port(source_port), v1_port(destination_port)) else {
        return Parsed::Invalid("v1 header with an invalid port");
    };
    Parsed::Header {
        len,
        source: Some(SocketAddr::new(source, port)),
    }
}

/// 1 to 5 decimal digits up to 65535 (no sign, which Rust's own parser would allow).
fn v1_port(field: &[u8]) -> Option<u16> {
    if field.is_empty() || field.len() > 5 || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn parse_v2(bytes: &[u8]) -> Parsed {
    if bytes.len() < V2_FIXED {
        return Parsed::Incomplete;
    }
    let version_command = bytes[12];
    if version_command >> 4 != 2 {
        return Parsed::Invalid("v2 header with a version other than 2");
    }
    let local = match version_command & 0x0f {
        0 => true,
        1 => false,
        _ => return Parsed::Invalid("v2 header with an unknown command"),
    };
    let (family, protocol) = (bytes[13] >> 4, bytes[13] & 0x0f);
    let addresses = match family {
        0 => 0,
        1 => 12,
        2 => 36,
        3 => V2_ADDRESSES_MAX,
        _ => return Parsed::Invalid("v2 header with an unknown address family"),
    };
    if protocol > 2 {
        return Parsed::Invalid("v2 header with an unknown transport protocol");
    }
    let declared = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    let len = V2_FIXED + declared;
    // LOCAL: the balancer's own connection (a health check); its addresses mean nothing.
    if local {
        return Parsed::Header { len, source: None };
    }
    if declared < addresses {
        return Parsed::Invalid("v2 header shorter than its address family");
    }
    // UNSPEC family or protocol, or a Unix socket: no IP client to name.
    if !matches!(family, 1 | 2) || protocol == 0 {
        return Parsed::Header { len, source: None };
    }
    let Some(block) = bytes.get(V2_FIXED..V2_FIXED + addresses) else {
        return Parsed::Incomplete;
    };
    let source = if family == 1 {
        let ip: [u8; 4] = block[..4].try_into().unwrap_or_default();
        SocketAddr::new(IpAddr::from(ip), u16::from_be_bytes([block[8], block[9]]))
    } else {
        let ip: [u8; 16] = block[..16].try_into().unwrap_or_default();
        SocketAddr::new(IpAddr::from(ip), u16::from_be_bytes([block[32], block[33]]))
    };
    Parsed::Header {
        len,
        source: Some(source),
    }
}

/// The client of a connection accepted from `peer` on a listener with `protocol` (its
/// `--proxy-protocol` setting): `peer` itself when it is off. `None`: close the connection.
pub async fn client_of(
    protocol: Option<&ProxyProtocol>,
    stream: &mut TcpStream,
    peer: SocketAddr,
) -> Option<SocketAddr> {
    match protocol {
        None => Some(peer),
        Some(pp) => pp.client(stream, peer).await,
    }
}

/// `--proxy-protocol` and its `--proxy-protocol-allow-ip`.
pub struct ProxyProtocol {
    allowed: IpList,
    timeout: Duration,
}

impl ProxyProtocol {
    /// `timeout` bounds the wait for the whole header (`--read-header-timeout`).
    pub fn new(allowed: IpList, timeout: Duration) -> Self {
        ProxyProtocol { allowed, timeout }
    }

    fn trusts(&self, peer: IpAddr) -> bool {
        self.allowed.is_empty() || self.allowed.contains(peer)
    }

    /// The client of a connection from `peer`: the one its header names when `peer` may
    /// name one, else `peer`. `None`: close the connection (a malformed header, or not
    /// one whole within the timeout).
    pub async fn client(&self, stream: &mut TcpStream, peer: SocketAddr) -> Option<SocketAddr> {
        let parsed = match tokio::time::timeout(self.timeout, read_header(stream)).await {
            Ok(Ok(parsed)) => parsed,
            Ok(Err(e)) => {
                tracing::debug!(peer = %peer, error = %e, "Unreadable PROXY protocol header");
                return None;
            }
            Err(_) => {
                tracing::debug!(peer = %peer, "PROXY protocol header timed out");
                return None;
            }
        };
        match parsed {
            Parsed::Absent => Some(peer),
            Parsed::Header { source, .. } if self.trusts(peer.ip()) => Some(source.unwrap_or(peer)),
            Parsed::Header { .. } => {
                tracing::debug!(peer = %peer, "Ignoring the PROXY protocol header of a peer outside --proxy-protocol-allow-ip");
                Some(peer)
            }
            Parsed::Invalid(reason) => {
                tracing::debug!(peer = %peer, reason, "Invalid PROXY protocol header");
                None
            }
            Parsed::Incomplete => None,
        }
    }
}

/// Waits until the start of the stream tells whether a header is there, and consumes
/// exactly the header's bytes.
async fn read_header(stream: &mut TcpStream) -> io::Result<Parsed> {
    let mut buf = [0u8; PEEK_MAX];
    let parsed = loop {
        stream.readable().await?;
        // Inside `try_io`, so that "not enough yet" clears the readiness the peek saw and
        // the next `readable()` waits for more bytes instead of spinning on these.
        let peeked = stream.try_io(Interest::READABLE, || {
            let n = peek(stream, &mut buf)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            match parse(&buf[..n]) {
                Parsed::Incomplete if n < PEEK_MAX => Err(io::ErrorKind::WouldBlock.into()),
                Parsed::Incomplete => Ok(Parsed::Invalid("header too long")),
                other => Ok(other),
            }
        });
        match peeked {
            Ok(parsed) => break parsed,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    if let Parsed::Header { len, .. } = parsed {
        // v2 TLVs may run past what was peeked: read and drop them, never a byte more.
        let mut left = len;
        while left > 0 {
            let n = stream.read(&mut buf[..left.min(PEEK_MAX)]).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            left -= n;
        }
    }
    Ok(parsed)
}

/// What the socket holds now, left in place.
fn peek(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket descriptor and a buffer of `buf.len()` writable bytes. The
    // socket is non-blocking (tokio's), so an empty queue is EAGAIN, not a wait.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: usize, source: &str) -> Parsed {
        Parsed::Header {
            len,
            source: Some(source.parse().unwrap()),
        }
    }

    #[test]
    fn v1_lines() {
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 80\r\nGET / HTTP/1.1\r\n";
        assert_eq!(parse(line), header(41, "203.0.113.7:5555"));
        let line = b"PROXY TCP6 2001:db8::5 2001:db8::1 4444 443\r\n";
        assert_eq!(parse(line), header(line.len(), "[2001:db8::5]:4444"));
        let line = b"PROXY UNKNOWN whatever follows\r\n";
        assert_eq!(
            parse(line),
            Parsed::Header {
                len: line.len(),
                source: None
            }
        );
        for bad in [
            &b"PROXY TCP4 203.0.113.7 10.0.0.1 5555\r\n"[..],
            b"PROXY TCP4 203.0.113.7  10.0.0.1 5555 80\r\n",
            b"PROXY TCP4 2001:db8::5 10.0.0.1 5555 80\r\n",
            b"PROXY TCP6 203.0.113.7 10.0.0.1 5555 80\r\n",
            b"PROXY TCP4 300.0.113.7 10.0.0.1 5555 80\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.1 +555 80\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.1 65536 80\r\n",
            b"PROXY UDP4 203.0.113.7 10.0.0.1 5555 80\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 80\n",
        ] {
            assert!(
                matches!(parse(bad), Parsed::Invalid(_)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [V1_SIGNATURE.as_slice(), &[b'x'; 120]].concat();
        assert!(matches!(parse(&long), Parsed::Invalid(_)));
    }

    #[test]
    fn what_is_not_a_header_is_absent_at_the_first_byte_that_says_so() {
        for (bytes, want) in [
            (&b""[..], Parsed::Incomplete),
            (b"P", Parsed::Incomplete),
            (b"PRO", Parsed::Incomplete),
            (b"PROPFIND / HTTP/1.1\r\n", Parsed::Absent),
            (b"POST / HTTP/1.1\r\n", Parsed::Absent),
            (b"GET / HTTP/1.1\r\n", Parsed::Absent),
            (b"\x16\x03\x01\x02\x00", Parsed::Absent),
            (b"\r\n", Parsed::Incomplete),
            (b"\r\nGET / HTTP/1.1\r\n", Parsed::Absent),
            (b"PROXY TCP4 203.0.113.7", Parsed::Incomplete),
        ] {
            assert_eq!(parse(bytes), want, "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    fn v2(command: u8, family_protocol: u8, addresses: &[u8], tlvs: usize) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family_protocol);
        h.extend_from_slice(&u16::try_from(addresses.len() + tlvs).unwrap().to_be_bytes());
        h.extend_from_slice(addresses);
        h.extend(std::iter::repeat_n(0xAB, tlvs));
        h
    }

    #[test]
    fn v2_headers() {
        let mut inet = vec![203, 0, 113, 7, 10, 0, 0, 1];
        inet.extend_from_slice(&5555u16.to_be_bytes());
        inet.extend_from_slice(&80u16.to_be_bytes());
        let h = v2(1, 0x11, &inet, 0);
        assert_eq!(parse(&h), header(28, "203.0.113.7:5555"));
        // TLVs past the peeked bytes: the length covers them, the address is read.
        let h = v2(1, 0x11, &inet, 1000);
        assert_eq!(parse(&h[..40]), header(1028, "203.0.113.7:5555"));
        let mut inet6 = "2001:db8::5".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        inet6.extend_from_slice(&[0; 16]);
        inet6.extend_from_slice(&4444u16.to_be_bytes());
        inet6.extend_from_slice(&443u16.to_be_bytes());
        let h = v2(1, 0x21, &inet6, 0);
        assert_eq!(parse(&h), header(52, "[2001:db8::5]:4444"));
        assert_eq!(parse(&h[..30]), Parsed::Incomplete);
        // LOCAL, UNSPEC and Unix sockets keep the connection's own address.
        for (command, fp, addresses) in [
            (0, 0x11, &inet[..]),
            (1, 0x00, &[][..]),
            (1, 0x31, &[0; 216][..]),
        ] {
            let h = v2(command, fp, addresses, 0);
            assert_eq!(
                parse(&h),
                Parsed::Header {
                    len: h.len(),
                    source: None
                }
            );
        }
        let mut bad_version = v2(1, 0x11, &inet, 0);
        bad_version[12] = 0x11;
        let mut short = v2(1, 0x11, &inet, 0);
        short[15] = 4;
        for bad in [
            bad_version,
            short,
            v2(2, 0x11, &inet, 0),
            v2(1, 0x41, &inet, 0),
            v2(1, 0x13, &inet, 0),
        ] {
            assert!(matches!(parse(&bad), Parsed::Invalid(_)), "{bad:?}");
        }
    }
}
