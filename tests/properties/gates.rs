//! Access gates: address lists and forwarded chains, basic-auth credentials, rate limits.

use http::{HeaderMap, HeaderValue};
use kamal_proxy::options::ServiceOptions;
use kamal_proxy::service::gates::Gates;
use kamal_proxy::service::gates::basic_auth::{BasicAuth, Credential, encode_flag};
use kamal_proxy::service::gates::client_ip::{ClientResolver, IpList};
use kamal_proxy::service::gates::rate_limit::RateLimit;
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn list(entries: &[String]) -> Result<IpList, String> {
    IpList::parse(entries, "allow-ip")
}

/// Any address but IPv4-mapped IPv6, which the lists refuse (written as plain IPv4).
fn address() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<Ipv4Addr>().prop_map(IpAddr::V4),
        any::<Ipv6Addr>()
            .prop_filter("mapped", |a| a.to_ipv4_mapped().is_none())
            .prop_map(IpAddr::V6),
    ]
}

fn lower_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    /// A listed address, or any range written around it, contains it; so does the
    /// IPv4-mapped form of a listed IPv4 address.
    #[test]
    fn lists_contain_what_they_list(a in address(), len in 0u8..=128) {
        let l = list(&[a.to_string()]).map_err(TestCaseError::fail)?;
        prop_assert!(l.contains(a));
        let len = if a.is_ipv4() { len % 33 } else { len };
        let l = list(&[format!("{a}/{len}")]).map_err(TestCaseError::fail)?;
        prop_assert!(l.contains(a));
        if let IpAddr::V4(v4) = a {
            prop_assert!(l.contains(IpAddr::V6(v4.to_ipv6_mapped())));
        }
    }

    /// Any entry: a list or the fork's error naming the flag, never a panic.
    #[test]
    fn arbitrary_entries_never_panic(entry in prop_oneof![any::<String>(), "[0-9a-f.:/% ]{0,20}"]) {
        if let Err(e) = list(&[entry]) {
            prop_assert!(e.starts_with("allow-ip: "), "{}", e);
        }
    }

    /// Behind a trusted proxy the client is the nearest untrusted hop of the forwarded
    /// chain, however the chain is split across header lines; an untrusted peer is the
    /// client whatever the headers say.
    #[test]
    fn forwarded_chains_resolve_to_the_nearest_untrusted_hop(client in any::<Ipv4Addr>(), hops in prop::collection::vec(0u8..=255, 0..5), split in any::<prop::sample::Index>()) {
        prop_assume!(client.octets()[0] != 10);
        let trusted = list(&["10.0.0.0/8".to_string()]).unwrap();
        let resolver = ClientResolver::new(trusted, "");
        let mut chain = vec![client.to_string()];
        chain.extend(hops.iter().map(|h| format!("10.0.0.{h}")));
        let at = split.index(chain.len()) + 1;
        let mut headers = HeaderMap::new();
        for part in [&chain[..at], &chain[at..]] {
            if !part.is_empty() {
                headers.append("x-forwarded-for", HeaderValue::from_str(&part.join(", ")).unwrap());
            }
        }
        let peer: IpAddr = "10.1.1.1".parse().unwrap();
        prop_assert_eq!(resolver.resolve(peer, &headers), Some(IpAddr::V4(client)));
        let outsider = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        prop_assert_eq!(resolver.resolve(outsider, &headers), Some(outsider));
    }

    /// Arbitrary forwarded header bytes never panic the resolver.
    #[test]
    fn arbitrary_forwarded_headers_never_panic(values in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..4), header in "(x-forwarded-for|x-real-ip|cf-connecting-ip)") {
        let trusted = list(&["0.0.0.0/1".to_string(), "::/1".to_string()]).unwrap();
        let resolver = ClientResolver::new(trusted, &header);
        let mut headers = HeaderMap::new();
        for v in values {
            if let Ok(v) = HeaderValue::from_bytes(&v) {
                headers.append(http::HeaderName::from_bytes(header.as_bytes()).unwrap(), v);
            }
        }
        let _ = resolver.resolve("10.0.0.1".parse().unwrap(), &headers);
    }

    /// `--basic-auth user:password` is hashed, stored, read back and matches exactly that
    /// user and password (passwords may hold colons, users may not).
    #[test]
    fn credentials_round_trip(user in "[^:]{1,12}", password in ".{1,16}", other in ".{0,16}") {
        let stored = encode_flag(&format!("{user}:{password}")).map_err(TestCaseError::fail)?;
        let c = Credential::parse(&stored).map_err(TestCaseError::fail)?;
        prop_assert!(c.matches(&user, &password));
        if other != password {
            prop_assert!(!c.matches(&user, &other));
        }
    }

    /// A stored credential is read only in its exact form: `sha256:` then 16 and 32 bytes
    /// in hex (found: a sign such as `+f` was read as a hex byte).
    #[test]
    fn stored_credentials_are_exact(salt in prop::collection::vec(any::<u8>(), 16), digest in prop::collection::vec(any::<u8>(), 32), text in prop_oneof![any::<String>(), "sha256:[0-9a-fA-F+-]{30,34}:[0-9a-fA-F+-]{62,66}"]) {
        let good = format!("sha256:{}:{}", lower_hex(&salt), lower_hex(&digest));
        prop_assert!(Credential::parse(&good).is_ok());
        prop_assert!(Credential::parse(&good.to_uppercase().replacen("SHA256", "sha256", 1)).is_ok());
        let well_formed = text.strip_prefix("sha256:").and_then(|r| r.split_once(':')).is_some_and(|(s, d)| {
            s.len() == 32 && d.len() == 64 && s.bytes().chain(d.bytes()).all(|b| b.is_ascii_hexdigit())
        });
        prop_assert_eq!(Credential::parse(&text).is_ok(), well_formed, "{:?}", text);
    }

    /// Any `Authorization` header: checked and always removed, never a panic.
    #[test]
    fn arbitrary_authorization_headers(value in prop::collection::vec(any::<u8>(), 0..60), scheme in prop_oneof![Just(""), Just("Basic "), Just("basic ")]) {
        let gate = BasicAuth::new(Credential::parse(&encode_flag("u:p").unwrap()).unwrap());
        let mut bytes = scheme.as_bytes().to_vec();
        bytes.extend(value);
        if let Ok(v) = HeaderValue::from_bytes(&bytes) {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::AUTHORIZATION, v);
            let _ = gate.take_and_check(&mut headers);
            prop_assert!(headers.is_empty());
        }
    }

    /// Every rate and burst that validation accepts compiles into a working limiter (a
    /// rate of 1e-20/s, or a burst of 2^32-1 at 0.001/s, overflowed governor's clock).
    #[test]
    fn accepted_rate_limits_compile(rate in prop_oneof![any::<f64>(), 0.0..10.0, 1e-12..1e-6], burst in prop_oneof![Just(0i64), any::<u32>().prop_map(i64::from), any::<i64>()]) {
        let o = ServiceOptions { rate_limit: rate, rate_limit_burst: burst, ..Default::default() };
        if o.validate_with(kamal_proxy::service::gates::validate).is_ok() {
            let gates = Gates::compile("app", &o);
            prop_assert!(gates.is_ok());
        }
    }

    /// And the limiter itself takes any positive rate and burst (a state file may hold
    /// what validation would refuse): clamped, never a panic, the first request allowed.
    #[test]
    fn limiters_take_any_positive_rate(rate in prop_oneof![any::<f64>(), 1e-30..1e-6], burst in any::<u32>()) {
        prop_assume!(rate.is_finite() && rate > 0.0);
        let l = RateLimit::new(rate, burst, IpList::default());
        prop_assert!(l.allow(Some(IpAddr::V4(Ipv4Addr::LOCALHOST))));
        prop_assert!(l.retry_after_secs() >= 1);
    }
}
