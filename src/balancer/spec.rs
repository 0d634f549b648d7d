//! What `--target` and `--read-target` take: upstream's `host[:port]`, optionally followed
//! by the fork's weight attribute, `host[:port];weight=N` (fork F16, N from 1 to 1000,
//! 1 when absent).
//!
//! A spec is parsed once, where it enters (the CLI, the control socket, the state file);
//! everything after holds the address and the weight apart, because the address alone is
//! what upstream's state keys, the health checks, the container references and the access
//! log use.

/// The weight of a target given without one: every target counts the same.
pub const DEFAULT_WEIGHT: u32 = 1;
/// The fork's range (F16).
pub const MAX_WEIGHT: u32 = 1000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    /// `host[:port]`, as given (upstream's syntax, already checked).
    pub address: String,
    /// 1 to [`MAX_WEIGHT`].
    pub weight: u32,
}

impl TargetSpec {
    /// An address with the default weight (`address` has passed `validate_target`).
    pub fn plain(address: &str) -> TargetSpec {
        TargetSpec {
            address: address.to_string(),
            weight: DEFAULT_WEIGHT,
        }
    }

    /// Parses `host[:port][;weight=N]`. The address is checked first, with upstream's
    /// message, then the attributes with the fork's.
    pub fn parse(text: &str) -> Result<TargetSpec, String> {
        let mut parts = text.split(';');
        let address = parts.next().unwrap_or_default();
        validate_target(address)?;
        let mut weight = None;
        for attribute in parts {
            let value = attribute.strip_prefix("weight=").ok_or_else(|| {
                invalid(format!(
                    "'{attribute}' is not a target attribute, expected 'weight=N'"
                ))
            })?;
            if weight.is_some() {
                return Err(invalid("'weight' is given more than once".into()));
            }
            weight = Some(parse_weight(value)?);
        }
        Ok(TargetSpec {
            address: address.to_string(),
            weight: weight.unwrap_or(DEFAULT_WEIGHT),
        })
    }

    /// Parses a whole flag's worth, first error first.
    pub fn parse_all(texts: &[String]) -> Result<Vec<TargetSpec>, String> {
        texts.iter().map(|t| TargetSpec::parse(t)).collect()
    }

    /// Pairs saved addresses with their saved weights (none saved: every weight is 1).
    pub fn zip(addresses: &[String], weights: &[u32]) -> Vec<TargetSpec> {
        addresses
            .iter()
            .enumerate()
            .map(|(i, address)| TargetSpec {
                address: address.clone(),
                weight: weights.get(i).copied().unwrap_or(DEFAULT_WEIGHT),
            })
            .collect()
    }
}

/// `address` for the default weight (as the fork renders it), else `address;weight=N`:
/// what `list` shows and what parses back to the same spec.
impl std::fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.weight == DEFAULT_WEIGHT {
            f.write_str(&self.address)
        } else {
            write!(f, "{};weight={}", self.address, self.weight)
        }
    }
}

/// A weight as the fork reads it: a whole number (Go's `strconv.Atoi`: an optional sign,
/// decimal digits) within 1 to 1000.
pub fn parse_weight(value: &str) -> Result<u32, String> {
    let digits = value.strip_prefix(['+', '-']).unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(format!("'{value}' is not a whole number")));
    }
    let n: i64 = match value.parse() {
        Ok(n) => n,
        // Digits beyond 64 bits: a whole number, far out of range.
        Err(_) => return Err(invalid(format!("{value} is outside 1-{MAX_WEIGHT}"))),
    };
    check_weight(n)
}

/// A weight within the fork's range (1 to 1000).
pub fn check_weight(n: i64) -> Result<u32, String> {
    u32::try_from(n)
        .ok()
        .filter(|w| (DEFAULT_WEIGHT..=MAX_WEIGHT).contains(w))
        .ok_or_else(|| invalid(format!("{n} is outside 1-{MAX_WEIGHT}")))
}

fn invalid(detail: String) -> String {
    format!("invalid target weight: {detail}")
}

/// Upstream's target syntax: a word character followed by at least one of word, `-`, `_`,
/// `.`, `+`, then an optional `:port`. IPv6 literals, schemes and paths are refused.
pub fn validate_target(addr: &str) -> Result<(), String> {
    let (host, port) = match addr.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (addr, None),
    };
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = host.chars();
    let ok_host = match chars.next() {
        Some(first) if word(first) => {
            let rest: Vec<char> = chars.collect();
            !rest.is_empty()
                && rest
                    .iter()
                    .all(|&c| word(c) || matches!(c, '-' | '.' | '+'))
        }
        _ => false,
    };
    let ok_port = port.is_none_or(|p| {
        !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) && p.parse::<u16>().is_ok()
    });
    if ok_host && ok_port {
        Ok(())
    } else {
        Err(format!("{addr} :invalid host pattern"))
    }
}

/// The container a target names, for scale-to-zero: its host part, unless that is an
/// address rather than a name.
pub fn container_ref(target: &str) -> Result<&str, String> {
    let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
    if host.is_empty() || host.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!(
            "target {target} is an address, not a container; name the container with --sleep-container"
        ));
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_syntax() {
        for ok in [
            "web-1",
            "web-1:3000",
            "localhost:80",
            "127.0.0.1:8080",
            "abc123def456:80",
        ] {
            assert!(validate_target(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "_",
            "/",
            "a",
            "http://x:80",
            "[::1]:80",
            "x:port",
            "x:99999",
            "a/b",
        ] {
            assert_eq!(
                validate_target(bad).unwrap_err(),
                format!("{bad} :invalid host pattern")
            );
        }
    }

    #[test]
    fn container_refs() {
        assert_eq!(container_ref("web-1:3000").unwrap(), "web-1");
        assert_eq!(container_ref("abc123def456:80").unwrap(), "abc123def456");
        assert!(
            container_ref("10.0.0.5:3000")
                .unwrap_err()
                .contains("--sleep-container")
        );
        assert!(container_ref("127.0.0.1:80").is_err());
    }

    #[test]
    fn addresses_with_and_without_weights() {
        let spec = TargetSpec::parse("web-1:3000;weight=5").unwrap();
        assert_eq!((spec.address.as_str(), spec.weight), ("web-1:3000", 5));
        assert_eq!(spec.to_string(), "web-1:3000;weight=5");
        let spec = TargetSpec::parse("web-1").unwrap();
        assert_eq!((spec.address.as_str(), spec.weight), ("web-1", 1));
        // The default weight renders as the bare address (fork `TestTargetList_Specs`).
        assert_eq!(
            TargetSpec::parse("web:80;weight=1").unwrap().to_string(),
            "web:80"
        );
        assert_eq!(TargetSpec::parse("web;weight=+7").unwrap().weight, 7);
        assert_eq!(TargetSpec::parse("web;weight=1000").unwrap().weight, 1000);
    }

    #[test]
    fn the_fork_s_messages() {
        let err = |t: &str| TargetSpec::parse(t).unwrap_err();
        assert_eq!(
            err("web:80;weight=0"),
            "invalid target weight: 0 is outside 1-1000"
        );
        assert_eq!(
            err("web:80;weight=-3"),
            "invalid target weight: -3 is outside 1-1000"
        );
        assert_eq!(
            err("web:80;weight=1001"),
            "invalid target weight: 1001 is outside 1-1000"
        );
        assert_eq!(
            err("web:80;weight=99999999999999999999"),
            "invalid target weight: 99999999999999999999 is outside 1-1000"
        );
        assert_eq!(
            err("web:80;weight=x"),
            "invalid target weight: 'x' is not a whole number"
        );
        assert_eq!(
            err("web:80;weight="),
            "invalid target weight: '' is not a whole number"
        );
        assert_eq!(
            err("web:80;weight=1.5"),
            "invalid target weight: '1.5' is not a whole number"
        );
        assert_eq!(
            err("web:80;color=red"),
            "invalid target weight: 'color=red' is not a target attribute, expected 'weight=N'"
        );
        assert_eq!(
            err("web:80;"),
            "invalid target weight: '' is not a target attribute, expected 'weight=N'"
        );
        assert_eq!(
            err("web:80;weight=2;weight=3"),
            "invalid target weight: 'weight' is given more than once"
        );
        // The host is checked first, with upstream's message, weight or not.
        assert_eq!(err(";weight=5"), " :invalid host pattern");
        assert_eq!(err("a/b;weight=5"), "a/b :invalid host pattern");
    }

    #[test]
    fn saved_weights_pair_with_their_addresses() {
        let specs = TargetSpec::zip(&["aa:1".into(), "bb:1".into()], &[3, 4]);
        assert_eq!(specs[1], TargetSpec::parse("bb:1;weight=4").unwrap());
        let specs = TargetSpec::zip(&["aa:1".into()], &[]);
        assert_eq!(specs, vec![TargetSpec::plain("aa:1")]);
    }
}
