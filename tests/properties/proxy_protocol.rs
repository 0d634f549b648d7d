//! PROXY protocol headers (v1 text, v2 binary): what a load balancer, or anyone who can
//! reach a port with `--proxy-protocol`, sends before HTTP or TLS.

use kamal_proxy::server::proxy_protocol::{Parsed, V1_MAX, V2_SIGNATURE, parse};
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

fn v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let family = if source.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {family} {} {} {} {}\r\n",
        source.ip(),
        destination.ip(),
        source.port(),
        destination.port()
    )
    .into_bytes()
}

/// A v2 PROXY header for a TCP connection, `tlvs` bytes of TLVs after the addresses.
fn v2(source: SocketAddr, destination: SocketAddr, tlvs: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    let family = match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            block.extend_from_slice(&s.octets());
            block.extend_from_slice(&d.octets());
            0x11
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(v6) => v6,
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            };
            block.extend_from_slice(&v6(s).octets());
            block.extend_from_slice(&v6(d).octets());
            0x21
        }
    };
    block.extend_from_slice(&source.port().to_be_bytes());
    block.extend_from_slice(&destination.port().to_be_bytes());
    block.extend_from_slice(tlvs);
    let mut h = V2_SIGNATURE.to_vec();
    h.push(0x21);
    h.push(family);
    h.extend_from_slice(&u16::try_from(block.len()).unwrap().to_be_bytes());
    h.extend_from_slice(&block);
    h
}

fn socket(v4: bool) -> BoxedStrategy<SocketAddr> {
    if v4 {
        (any::<Ipv4Addr>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(ip), port))
            .boxed()
    } else {
        (any::<Ipv6Addr>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(ip), port))
            .boxed()
    }
}

fn pair() -> impl Strategy<Value = (SocketAddr, SocketAddr)> {
    any::<bool>().prop_flat_map(|v4| (socket(v4), socket(v4)))
}

/// The first bytes of a connection: anything, or something close to a header.
fn start() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        (
            pair(),
            prop::collection::vec(any::<u8>(), 0..40),
            0usize..120
        )
            .prop_map(|((s, d), noise, at)| {
                let mut h = v1(s, d);
                let at = at.min(h.len());
                h.splice(at..at, noise);
                h
            }),
        (
            pair(),
            prop::collection::vec(any::<u8>(), 0..40),
            0usize..60
        )
            .prop_map(|((s, d), noise, at)| {
                let mut h = v2(s, d, &[]);
                let at = at.min(h.len());
                h.splice(at..at, noise);
                h
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    /// A generated v1 line reads back as its client and its exact length, whatever
    /// follows it on the connection.
    #[test]
    fn v1_round_trip((s, d) in pair(), tail in prop::collection::vec(any::<u8>(), 0..64)) {
        let line = v1(s, d);
        prop_assert!(line.len() <= V1_MAX);
        let with_tail = [line.clone(), tail].concat();
        prop_assert_eq!(parse(&with_tail), Parsed::Header { len: line.len(), source: Some(s) });
        // Every shorter part of it is not enough to tell.
        for cut in 0..line.len() {
            prop_assert_eq!(parse(&line[..cut]), Parsed::Incomplete, "cut at {}", cut);
        }
    }

    /// A generated v2 header reads back as its client, its length covering the TLVs,
    /// even when only the addresses have arrived.
    #[test]
    fn v2_round_trip((s, d) in pair(), tlvs in prop::collection::vec(any::<u8>(), 0..600)) {
        let h = v2(s, d, &tlvs);
        let want = Parsed::Header { len: h.len(), source: Some(s) };
        prop_assert_eq!(parse(&h), want);
        let addresses = h.len() - tlvs.len();
        prop_assert_eq!(parse(&h[..addresses]), want);
        for cut in 0..addresses {
            prop_assert_eq!(parse(&h[..cut]), Parsed::Incomplete, "cut at {}", cut);
        }
    }

    /// Any bytes: never a panic; a v1 header never longer than the spec's 107 bytes nor
    /// than what was given; and a decision, once made, stands whatever arrives next
    /// (the reader peeks again only while the answer is "incomplete").
    #[test]
    fn decisions_are_final(start in start(), more in prop::collection::vec(any::<u8>(), 0..64)) {
        let parsed = parse(&start);
        if let Parsed::Header { len, .. } = parsed {
            if start.first() == Some(&b'P') {
                prop_assert!(len <= V1_MAX && len <= start.len());
            } else {
                prop_assert!(len >= 16);
            }
        }
        if parsed != Parsed::Incomplete {
            prop_assert_eq!(parse(&[start, more].concat()), parsed);
        }
    }
}
