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
}
