//! The rollout split (upstream §4.5): which requests go to the rollout pool instead of the
//! active one. The application decides who is in the rollout by setting the
//! `kamal-rollout` cookie (the proxy never sets it); a request whose cookie value is in the
//! allow list, or hashes into the first `percentage` of the 32-bit FNV-1a range, goes to
//! the rollout pool.
//!
//! The serde shape is upstream's `rollout_controller` state key, so Go kamal-proxy reads a
//! saved split back as it would have written it.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The cookie whose value decides a request's side of the split.
pub const ROLLOUT_COOKIE: &str = "kamal-rollout";

/// The largest FNV-1a-32 hash, as the float upstream scales by.
const MAX_HASH: f64 = u32::MAX as f64;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RolloutSplit {
    /// `rollout set --percent`; not range-checked, as upstream (≥ 100 routes every cookie
    /// holder, < 0 none).
    #[serde(default)]
    pub percentage: i64,
    /// `percentage / 100 × 4294967295`, kept as upstream writes it; requests compare
    /// against this value, so a file read back routes exactly as it did.
    #[serde(default)]
    pub percentage_split_point: f64,
    /// `rollout set --list`: cookie values that always go to the rollout pool. Written as
    /// `null` when empty, as Go writes it (an empty list reaches upstream's server as a nil
    /// slice); `null` and `[]` both load.
    #[serde(
        default,
        serialize_with = "empty_as_null",
        deserialize_with = "null_as_empty"
    )]
    pub allowlist: Vec<String>,
}

fn empty_as_null<S: Serializer>(list: &[String], s: S) -> Result<S::Ok, S::Error> {
    if list.is_empty() {
        s.serialize_none()
    } else {
        list.serialize(s)
    }
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

impl RolloutSplit {
    pub fn new(percentage: i64, allowlist: Vec<String>) -> RolloutSplit {
        RolloutSplit {
            percentage,
            percentage_split_point: MAX_HASH * (percentage as f64 / 100.0),
            allowlist,
        }
    }

    /// Whether a request carrying `kamal-rollout=<value>` goes to the rollout pool. An
    /// empty value never does.
    pub fn routes(&self, value: &str) -> bool {
        if value.is_empty() {
            return false;
        }
        self.allowlist.iter().any(|v| v == value)
            || f64::from(fnv1a32(value.as_bytes())) <= self.percentage_split_point
    }
}

/// FNV-1a, 32 bits (Go's `hash/fnv.New32a`).
pub fn fnv1a32(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream §4.5's worked values: where each cookie value falls in the hash range, in
    /// percent, to two decimals.
    const WORKED: [(&str, f64); 9] = [
        ("1", 20.33),
        ("2", 21.50),
        ("3", 21.11),
        ("carol", 40.25),
        ("bob", 52.65),
        ("alice", 52.79),
        ("a", 89.08),
        ("b", 90.25),
        ("user-1", 95.83),
    ];

    fn percentile(value: &str) -> f64 {
        f64::from(fnv1a32(value.as_bytes())) / MAX_HASH * 100.0
    }

    #[test]
    fn fnv1a32_matches_the_worked_values() {
        // The reference vectors of the FNV specification first.
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        for (value, expected) in WORKED {
            let got = (percentile(value) * 100.0).round() / 100.0;
            assert_eq!(got, expected, "{value}");
        }
    }

    #[test]
    fn a_percentage_routes_the_values_that_hash_below_it() {
        let split = RolloutSplit::new(50, vec![]);
        for (value, pct) in WORKED {
            assert_eq!(split.routes(value), pct <= 50.0, "{value} at {pct}");
        }
        // 21 takes "1" (20.33) but neither "3" (21.11) nor "2" (21.50); 22 takes all three.
        let split = RolloutSplit::new(21, vec![]);
        assert!(split.routes("1") && !split.routes("3") && !split.routes("2"));
        let split = RolloutSplit::new(22, vec![]);
        assert!(split.routes("1") && split.routes("3") && split.routes("2"));
        assert!(RolloutSplit::new(100, vec![]).routes("user-1"));
        assert!(!RolloutSplit::new(0, vec![]).routes("1"));
        assert!(!RolloutSplit::new(-5, vec![]).routes("1"));
        assert!(!RolloutSplit::new(100, vec![]).routes(""), "empty cookie");
    }

    #[test]
    fn the_allow_list_wins_over_the_percentage() {
        let split = RolloutSplit::new(10, vec!["user-1".into(), "b".into()]);
        assert!(split.routes("user-1") && split.routes("b"));
        assert!(!split.routes("a"), "89.08 is above 10%");
        assert!(!split.routes("carol"));
    }

    #[test]
    fn state_shape_is_upstream_s() {
        let split = RolloutSplit::new(20, vec!["first".into()]);
        let json = serde_json::to_value(&split).unwrap();
        assert_eq!(json["percentage"], 20);
        assert_eq!(json["percentage_split_point"], 858993459.0);
        assert_eq!(json["allowlist"], serde_json::json!(["first"]));
        // What Go writes for `rollout set --percent=20` without a list, and a newer
        // upstream's extra key, both load.
        let go: RolloutSplit = serde_json::from_str(
            r#"{"percentage":20,"percentage_split_point":858993459,"allowlist":null,"disabled":false}"#,
        )
        .unwrap();
        assert_eq!(go, RolloutSplit::new(20, vec![]));
        // And we write what Go writes for it; an empty list read back is the same split.
        assert_eq!(
            serde_json::to_value(&go).unwrap()["allowlist"],
            serde_json::Value::Null
        );
        let ours: RolloutSplit = serde_json::from_str(
            r#"{"percentage":20,"percentage_split_point":858993459,"allowlist":[]}"#,
        )
        .unwrap();
        assert_eq!(ours, go);
    }
}
