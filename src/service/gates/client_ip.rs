//! Who the client is: address lists (`--allow-ip`, `--trusted-proxy`, `--rate-limit-exempt`)
//! and the resolver that looks past the operator's own proxies.
//!
//! The connecting address is the client unless it is one of the declared trusted proxies;
//! only then is a forwarded chain read, and a chain that cannot be resolved yields no
//! address at all (which the allow list denies), never the peer: falling back to the peer
//! would let anyone in when the allow list contains the proxy's own range.

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use std::net::IpAddr;

/// How many forwarded entries are considered, counted from the nearest hop.
const CHAIN_LIMIT: usize = 32;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// A parsed list of addresses and ranges (bare addresses become /32 or /128).
#[derive(Debug, Clone, Default)]
pub struct IpList(Vec<IpNet>);

impl IpList {
    /// Parses every entry; errors carry the flag name, as the fork words them.
    pub fn parse(entries: &[String], flag: &str) -> Result<IpList, String> {
        entries
            .iter()
            .map(|e| parse_entry(e).map_err(|err| format!("{flag}: {err}")))
            .collect::<Result<Vec<_>, _>>()
            .map(IpList)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = normalize(addr);
        self.0.iter().any(|net| net.contains(&addr))
    }

    pub fn has_ipv6(&self) -> bool {
        self.0.iter().any(|n| matches!(n, IpNet::V6(_)))
    }

    pub fn nets(&self) -> &[IpNet] {
        &self.0
    }
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is matched as the IPv4 address it carries.
pub fn normalize(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

fn parse_entry(entry: &str) -> Result<IpNet, String> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err("address or CIDR range cannot be empty".into());
    }
    if entry.contains('/') {
        let net: IpNet = entry
            .parse()
            .map_err(|_| format!("\"{entry}\" is not a valid CIDR range"))?;
        if let IpNet::V6(v6) = net {
            if v6.addr().to_ipv4_mapped().is_some() {
                return Err(format!(
                    "\"{entry}\" is an IPv4-mapped range; write it as plain IPv4"
                ));
            }
        }
        // 10.1.2.3/8 means 10.0.0.0/8.
        return Ok(net.trunc());
    }
    if entry.contains('%') {
        return Err(format!(
            "\"{entry}\" carries an IPv6 zone; write the address without it"
        ));
    }
    let addr: IpAddr = entry
        .parse()
        .map_err(|_| format!("\"{entry}\" is not a valid address"))?;
    if let IpAddr::V6(v6) = addr {
        if v6.to_ipv4_mapped().is_some() {
            return Err(format!(
                "\"{entry}\" is an IPv4-mapped address; write it as plain IPv4"
            ));
        }
    }
    Ok(IpNet::from(addr))
}

/// Resolves the client address of a request: shared by the allow list and the rate
/// limiter, so the trust rules have one implementation.
#[derive(Debug, Clone, Default)]
pub struct ClientResolver {
    trusted: IpList,
    /// `--client-ip-header`, read in its original form; `X-Forwarded-For` otherwise.
    header: Option<HeaderName>,
}

impl ClientResolver {
    pub fn new(trusted: IpList, header: &str) -> ClientResolver {
        let header = (!header.is_empty())
            .then(|| HeaderName::from_bytes(header.as_bytes()).ok())
            .flatten();
        ClientResolver { trusted, header }
    }

    pub fn trusted(&self) -> &IpList {
        &self.trusted
    }

    /// The peer, unless the peer is a trusted proxy: then the nearest untrusted entry of
    /// the forwarded chain. `None` when that chain is missing, unreadable or all trusted.
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = normalize(peer);
        if self.trusted.is_empty() || !self.trusted.contains(peer) {
            return Some(peer);
        }
        let name = self.header.as_ref().unwrap_or(&X_FORWARDED_FOR);
        // Every header line counts: a hop that appends its own line leaves a forged first
        // line in front, so reading only the first would hand the walk to the client.
        let mut entries: Vec<&str> = Vec::new();
        for value in headers.get_all(name) {
            let Ok(value) = value.to_str() else {
                return None;
            };
            entries.extend(value.split(','));
        }
        let start = entries.len().saturating_sub(CHAIN_LIMIT);
        for entry in entries[start..].iter().rev() {
            let addr = parse_forwarded(entry)?;
            if !self.trusted.contains(addr) {
                return Some(addr);
            }
        }
        None
    }
}

/// One forwarded entry: a bare address, or `addr:port` / `[v6]:port` as some proxies
/// write it.
fn parse_forwarded(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if let Ok(a) = entry.parse::<IpAddr>() {
        return Some(normalize(a));
    }
    entry
        .parse::<std::net::SocketAddr>()
        .ok()
        .map(|s| normalize(s.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn list(entries: &[&str]) -> IpList {
        IpList::parse(
            &entries.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "allow-ip",
        )
        .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_addresses_and_masks_ranges() {
        let l = list(&["10.1.2.3/8", "192.0.2.7", "2001:db8::/32", "::1"]);
        assert!(l.contains(ip("10.200.0.1")));
        assert!(l.contains(ip("192.0.2.7")));
        assert!(!l.contains(ip("192.0.2.8")));
        assert!(l.contains(ip("2001:db8:1::5")));
        assert!(l.contains(ip("::1")));
        assert!(l.has_ipv6());
        // A mapped client matches the IPv4 range.
        assert!(l.contains(ip("::ffff:10.9.9.9")));
        assert!(!list(&["10.0.0.0/8"]).has_ipv6());
    }

    #[test]
    fn rejects_malformed_entries_with_the_forks_words() {
        let e = |s: &str| IpList::parse(&[s.to_string()], "allow-ip").unwrap_err();
        assert_eq!(e(" "), "allow-ip: address or CIDR range cannot be empty");
        assert_eq!(
            e("10.0.0.0/33"),
            "allow-ip: \"10.0.0.0/33\" is not a valid CIDR range"
        );
        assert_eq!(e("nope"), "allow-ip: \"nope\" is not a valid address");
        assert_eq!(
            e("::ffff:10.0.0.0/104"),
            "allow-ip: \"::ffff:10.0.0.0/104\" is an IPv4-mapped range; write it as plain IPv4"
        );
        assert_eq!(
            e("::ffff:10.0.0.1"),
            "allow-ip: \"::ffff:10.0.0.1\" is an IPv4-mapped address; write it as plain IPv4"
        );
        assert_eq!(
            e("fe80::1%eth0"),
            "allow-ip: \"fe80::1%eth0\" carries an IPv6 zone; write the address without it"
        );
    }

    fn headers(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append("x-forwarded-for", HeaderValue::from_str(l).unwrap());
        }
        h
    }

    #[test]
    fn untrusted_peers_are_the_client() {
        let r = ClientResolver::new(IpList::default(), "");
        assert_eq!(
            r.resolve(ip("198.51.100.1"), &headers(&["10.0.0.1"])),
            Some(ip("198.51.100.1"))
        );
        let r = ClientResolver::new(list(&["10.0.0.0/8"]), "");
        assert_eq!(
            r.resolve(ip("198.51.100.1"), &headers(&["10.0.0.1"])),
            Some(ip("198.51.100.1"))
        );
    }

    #[test]
    fn walks_trusted_chains_from_the_nearest_hop() {
        let r = ClientResolver::new(list(&["10.0.0.0/8"]), "");
        let peer = ip("10.0.0.2");
        assert_eq!(
            r.resolve(peer, &headers(&["1.1.1.1, 203.0.113.9, 10.0.0.7"])),
            Some(ip("203.0.113.9"))
        );
        // A forged first line does not win over the line the trusted hop appended.
        assert_eq!(
            r.resolve(peer, &headers(&["6.6.6.6", "203.0.113.9"])),
            Some(ip("203.0.113.9"))
        );
        // Ports and mapped forms are read.
        assert_eq!(
            r.resolve(peer, &headers(&["[2001:db8::1]:443"])),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(
            r.resolve(peer, &headers(&["::ffff:203.0.113.9"])),
            Some(ip("203.0.113.9"))
        );
        // Unresolvable: missing, garbage, all trusted.
        assert_eq!(r.resolve(peer, &headers(&[])), None);
        assert_eq!(r.resolve(peer, &headers(&["garbage"])), None);
        assert_eq!(r.resolve(peer, &headers(&["10.1.1.1, 10.2.2.2"])), None);
        // Garbage nearer than the client stops the walk.
        assert_eq!(r.resolve(peer, &headers(&["203.0.113.9, x"])), None);
    }

    #[test]
    fn only_the_last_32_entries_count() {
        let r = ClientResolver::new(list(&["10.0.0.0/8"]), "");
        let mut chain = vec!["203.0.113.9".to_string()];
        chain.extend((0..32).map(|i| format!("10.0.0.{i}")));
        assert_eq!(
            r.resolve(ip("10.0.0.1"), &headers(&[&chain.join(",")])),
            None
        );
        chain.remove(1);
        assert_eq!(
            r.resolve(ip("10.0.0.1"), &headers(&[&chain.join(",")])),
            Some(ip("203.0.113.9"))
        );
    }

    #[test]
    fn reads_the_named_client_ip_header() {
        let r = ClientResolver::new(list(&["10.0.0.0/8"]), "CF-Connecting-IP");
        let mut h = headers(&["6.6.6.6"]);
        h.insert("cf-connecting-ip", HeaderValue::from_static("203.0.113.9"));
        assert_eq!(r.resolve(ip("10.0.0.1"), &h), Some(ip("203.0.113.9")));
    }
}
