//! Session affinity pins (fork F17): the value of the cookie that keeps a client on one
//! target.
//!
//! A pin is the first 16 bytes of HMAC-SHA256(key, target address), in hex: opaque (it
//! does not reveal the address) and unforgeable without the key, so a client can only
//! ever name a target it was given. Each target's pin is computed once, when its pool is
//! built, so the request path compares strings and hashes nothing.
//!
//! The key belongs to the service, not to one pool: a redeploy passes it on, so a client
//! pinned to a target that stays in the new pool stays pinned (only clients of a target
//! that left are re-pinned); a sleep and wake keeps the pool and so the pins; and the
//! state file keeps the key, so a restart or a proxy upgrade does not re-pin everyone.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const KEY_LEN: usize = 32;
/// Bytes of the HMAC kept in a pin.
const PIN_LEN: usize = 16;

/// The secret a service's pins are made with.
#[derive(Clone, PartialEq, Eq)]
pub struct PinKey([u8; KEY_LEN]);

impl PinKey {
    /// A fresh random key (the operating system's generator).
    pub fn generate() -> Result<PinKey, String> {
        let mut key = [0u8; KEY_LEN];
        getrandom::getrandom(&mut key)
            .map_err(|e| format!("cannot draw a session affinity key: {e}"))?;
        Ok(PinKey(key))
    }

    /// The pin of a target: 32 hex digits.
    pub fn pin(&self, address: &str) -> Box<str> {
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &self.0);
        let tag = aws_lc_rs::hmac::sign(&key, address.as_bytes());
        hex(&tag.as_ref()[..PIN_LEN]).into_boxed_str()
    }

    fn from_hex(text: &str) -> Option<PinKey> {
        if text.len() != KEY_LEN * 2 {
            return None;
        }
        let mut key = [0u8; KEY_LEN];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
        }
        Some(PinKey(key))
    }
}

/// Never printed: the key is a secret.
impl std::fmt::Debug for PinKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PinKey(..)")
    }
}

/// Saved as 64 hex digits (`session_affinity_key`, a key of ours in the state file).
impl Serialize for PinKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex(&self.0))
    }
}

impl<'de> Deserialize<'de> for PinKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PinKey, D::Error> {
        let text = String::deserialize(d)?;
        PinKey::from_hex(&text).ok_or_else(|| {
            serde::de::Error::custom("session_affinity_key is not 64 hexadecimal digits")
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::health::{self, HealthCheckConfig};
    use crate::balancer::spec::TargetSpec;
    use crate::balancer::tests::pool;
    use crate::balancer::{Health, LoadBalancer};
    use std::time::Duration;

    #[test]
    fn pins_are_opaque_stable_per_key_and_differ_between_keys() {
        let key = PinKey::generate().unwrap();
        let pin = key.pin("web-1:3000");
        assert_eq!(pin.len(), 32);
        assert!(pin.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!pin.contains("web"));
        assert_eq!(pin, key.pin("web-1:3000"), "the same target, the same pin");
        assert_ne!(pin, key.pin("web-2:3000"));
        let other = PinKey::generate().unwrap();
        assert_ne!(pin, other.pin("web-1:3000"), "a pin needs the key");
    }

    #[test]
    fn a_known_pin() {
        // HMAC-SHA256 with the all-zero key, as `openssl dgst -sha256 -mac HMAC` computes it.
        let key = PinKey([0; KEY_LEN]);
        assert_eq!(&*key.pin("web:80"), "0465ba8e983ea1e5c44925cd236d30af");
    }

    #[test]
    fn the_key_round_trips_as_hex_and_bad_keys_are_refused() {
        let key = PinKey::generate().unwrap();
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(json.len(), 66);
        let back: PinKey = serde_json::from_str(&json).unwrap();
        assert_eq!(back, key);
        for bad in ["\"\"", "\"zz\"", &format!("\"{}\"", "g".repeat(64)), "17"] {
            assert!(serde_json::from_str::<PinKey>(bad).is_err(), "{bad}");
        }
        assert_eq!(format!("{key:?}"), "PinKey(..)");
    }

    #[test]
    fn a_pin_holds_while_its_writer_is_healthy_and_is_replaced_when_it_is_not() {
        let lb = pool(&["w1:1", "w2:1", "w3:1"], &["reader:1"]);
        lb.mark_all_healthy();
        let first = lb.select_pinned(false, None).unwrap();
        assert!(first.repin, "no cookie: pinned afresh");
        let pin = first.target.pin().to_string();
        assert_eq!(pin.len(), 32);
        for _ in 0..10 {
            let again = lb.select_pinned(false, Some(&pin)).unwrap();
            assert_eq!(again.target.address(), first.target.address());
            assert!(!again.repin, "the cookie already names it");
        }
        // Reads served by a reader are never pinned.
        let read = lb.select_pinned(true, Some(&pin)).unwrap();
        assert_eq!((read.target.address(), read.repin), ("reader:1", false));
        // A forged pin counts for nothing.
        assert!(
            lb.select_pinned(false, Some("0123456789abcdef0123456789abcdef"))
                .unwrap()
                .repin
        );
        assert!(lb.select_pinned(false, Some("")).unwrap().repin);
        // The pinned writer fails: another one serves, and is pinned.
        first.target.set_health(Health::Unhealthy);
        lb.rebuild_healthy();
        let moved = lb.select_pinned(false, Some(&pin)).unwrap();
        assert_ne!(moved.target.address(), first.target.address());
        assert!(moved.repin);
        // No writer at all: nothing to pin to.
        lb.suspend();
        assert!(lb.select_pinned(false, Some(&pin)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_wake_a_pinned_client_waits_for_its_own_target_until_the_wake_deadline() {
        let lb = pool(&["w1:1", "w2:1"], &[]);
        lb.mark_all_healthy();
        let pin = lb.writers[1].pin().to_string();
        assert!(
            lb.starting_pin(false, &pin).is_none(),
            "no wake: nothing to wait for"
        );
        lb.suspend();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        lb.resume(deadline);
        lb.stop_health_checks(); // the test decides who answers
        // The other writer answers first: the wake is over, but this client waits.
        lb.record(&lb.writers[0], true);
        let (target, until) = lb
            .starting_pin(false, &pin)
            .expect("its target is starting");
        assert_eq!((target.address(), until), ("w2:1", deadline));
        let waited = {
            let lb = lb.clone();
            let target = target.clone();
            tokio::spawn(async move { lb.wait_for_target(&target, until).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        lb.record(&lb.writers[1], true);
        assert!(waited.await.unwrap());
        let pick = lb.select_pinned(false, Some(&pin)).unwrap();
        assert_eq!((pick.target.address(), pick.repin), ("w2:1", false));

        // A target that never comes back holds its clients until the deadline only.
        lb.suspend();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        lb.resume(deadline);
        lb.stop_health_checks();
        lb.record(&lb.writers[0], true);
        let (target, until) = lb.starting_pin(false, &pin).unwrap();
        let started = tokio::time::Instant::now();
        assert!(!lb.wait_for_target(&target, until).await);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert!(
            lb.starting_pin(false, &pin).is_none(),
            "past the deadline: re-pin at once"
        );
        assert!(lb.select_pinned(false, Some(&pin)).unwrap().repin);

        // A read that a healthy reader serves is never pinned, so it waits for nothing;
        // one that falls back to the writers waits as a write does.
        let lb = pool(&["w1:1", "w2:1"], &["reader:1"]);
        let pin = lb.writers[1].pin().to_string();
        lb.resume(tokio::time::Instant::now() + Duration::from_secs(30));
        lb.stop_health_checks();
        lb.record(&lb.writers[0], true);
        assert!(lb.starting_pin(true, &pin).is_some(), "no reader yet");
        lb.record(&lb.readers[0], true);
        assert!(lb.starting_pin(true, &pin).is_none());
        assert!(lb.starting_pin(false, &pin).is_some());
    }

    #[test]
    fn pins_depend_on_the_key_and_the_address_only() {
        let key = PinKey::generate().unwrap();
        let build = |writers: &[&str], key: &PinKey| {
            let specs: Vec<TargetSpec> = writers
                .iter()
                .map(|s| TargetSpec::parse(s).unwrap())
                .collect();
            LoadBalancer::new(
                "app",
                &specs,
                &[],
                key.clone(),
                HealthCheckConfig::default(),
                health::probe_client(),
            )
            .unwrap()
        };
        // A redeploy that keeps a target keeps its pin (the key is handed on).
        let old = build(&["aa:1", "bb:1"], &key);
        let new = build(&["bb:1;weight=3", "cc:1"], old.pin_key());
        assert_eq!(old.writers[1].pin(), new.writers[0].pin());
        assert_ne!(new.writers[0].pin(), new.writers[1].pin());
        let other = build(&["bb:1"], &PinKey::generate().unwrap());
        assert_ne!(other.writers[0].pin(), new.writers[0].pin());
    }
}
