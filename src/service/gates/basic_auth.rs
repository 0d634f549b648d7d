//! `--basic-auth`: HTTP Basic credentials per service, 401 with a challenge otherwise.
//!
//! The CLI hashes `user:password` before it leaves the deploy host, in the fork's format
//! `sha256:<hex 16-byte salt>:<hex SHA-256(salt ‖ user ‖ ":" ‖ password)>`, so the
//! plaintext never crosses the control socket or reaches the state file, and a state file
//! written by the fork loads here. SHA-256 rather than an adaptive KDF on purpose (as the
//! fork argues): verification runs for every unauthenticated request, and a deliberately
//! slow hash would be a CPU-exhaustion lever for exactly the clients the password keeps
//! out; the salt defeats precomputation against a leaked state file.

use base64::Engine;
use http::{HeaderMap, HeaderValue, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const SCHEME: &str = "sha256";
const SALT_LEN: usize = 16;
const DIGEST_LEN: usize = 32;

/// Splits the `--basic-auth` value at the first colon (passwords may contain colons,
/// usernames may not) and hashes it with a fresh salt.
pub fn encode_flag(value: &str) -> Result<String, String> {
    let Some((user, password)) = value.split_once(':') else {
        return Err("basic-auth must be given as <username>:<password>".into());
    };
    if user.is_empty() || password.is_empty() {
        return Err("basic-auth needs both a username and a password".into());
    }
    let mut salt = [0u8; SALT_LEN];
    getrandom::getrandom(&mut salt)
        .map_err(|e| format!("unable to generate a basic auth salt: {e}"))?;
    Ok(encode(&salt, user, password))
}

fn encode(salt: &[u8; SALT_LEN], user: &str, password: &str) -> String {
    format!(
        "{SCHEME}:{}:{}",
        hex(salt),
        hex(&digest(salt, user, password))
    )
}

fn digest(salt: &[u8], user: &str, password: &str) -> [u8; DIGEST_LEN] {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(user.as_bytes());
    h.update(b":");
    h.update(password.as_bytes());
    h.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    // Hex digits only: `from_str_radix` alone would also take a sign (`+f`).
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// A stored credential, ready to compare against requests.
#[derive(Debug, Clone)]
pub struct Credential {
    salt: Vec<u8>,
    digest: [u8; DIGEST_LEN],
}

impl Credential {
    /// Reads the stored form; the errors are the server-side validation messages.
    pub fn parse(encoded: &str) -> Result<Credential, String> {
        let Some((SCHEME, rest)) = encoded.split_once(':') else {
            return Err(format!("basic auth credential is not a {SCHEME} value"));
        };
        let Some((salt, digest)) = rest.split_once(':') else {
            return Err("basic auth credential is missing its digest".into());
        };
        let salt = unhex(salt)
            .filter(|s| s.len() == SALT_LEN)
            .ok_or("basic auth credential has an unreadable salt")?;
        let digest = unhex(digest)
            .and_then(|d| <[u8; DIGEST_LEN]>::try_from(d).ok())
            .ok_or("basic auth credential has an unreadable digest")?;
        Ok(Credential { salt, digest })
    }

    /// Constant-time over fixed-length digests, so neither part leaks its length.
    pub fn matches(&self, user: &str, password: &str) -> bool {
        digest(&self.salt, user, password)
            .ct_eq(&self.digest)
            .into()
    }
}

/// The gate: `None` credential means the stored value was unreadable, and the service
/// denies everyone (fail closed).
#[derive(Debug, Clone)]
pub struct BasicAuth {
    credential: Option<Credential>,
}

impl BasicAuth {
    pub fn new(credential: Credential) -> BasicAuth {
        BasicAuth {
            credential: Some(credential),
        }
    }

    pub fn deny_all() -> BasicAuth {
        BasicAuth { credential: None }
    }

    /// Takes the credentials off the request (always: even an exempt request must not
    /// carry a browser's cached password upstream) and says whether they were right.
    pub fn take_and_check(&self, headers: &mut HeaderMap) -> bool {
        let supplied = headers.remove(header::AUTHORIZATION);
        let Some(credential) = &self.credential else {
            return false;
        };
        let Some(decoded) = supplied.as_ref().and_then(decode_basic) else {
            return false;
        };
        std::str::from_utf8(&decoded)
            .ok()
            .and_then(|s| s.split_once(':'))
            .is_some_and(|(user, password)| credential.matches(user, password))
    }
}

/// The `user:password` bytes of `Authorization: Basic …`, the scheme case-insensitive.
fn decode_basic(value: &HeaderValue) -> Option<Vec<u8>> {
    let value = value.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth_header(user: &str, password: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let v = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Basic {v}")).unwrap(),
        );
        h
    }

    #[test]
    fn encodes_and_matches() {
        let stored = encode_flag("admin:s3cr:et ü").unwrap();
        assert!(stored.starts_with("sha256:"));
        assert!(!stored.contains("s3cr"));
        let c = Credential::parse(&stored).unwrap();
        assert!(c.matches("admin", "s3cr:et ü"));
        assert!(!c.matches("admin", "s3cr"));
        assert!(!c.matches("Admin", "s3cr:et ü"));
        assert!(!c.matches("s3cr:et ü", "admin"));
        assert!(!c.matches("admin", ""));
    }

    #[test]
    fn fresh_salt_per_encoding() {
        assert_ne!(encode_flag("a:b").unwrap(), encode_flag("a:b").unwrap());
    }

    #[test]
    fn a_known_vector_in_the_forks_format() {
        // sha256(salt ‖ "user:pass") with a zero salt.
        let stored = encode(&[0; SALT_LEN], "user", "pass");
        let mut expected = Sha256::new();
        expected.update([0u8; SALT_LEN]);
        expected.update(b"user:pass");
        let expected: [u8; 32] = expected.finalize().into();
        assert_eq!(
            stored,
            format!("sha256:{}:{}", "00".repeat(16), hex(&expected))
        );
    }

    #[test]
    fn flag_errors() {
        assert_eq!(
            encode_flag("nocolon").unwrap_err(),
            "basic-auth must be given as <username>:<password>"
        );
        assert_eq!(
            encode_flag(":pw").unwrap_err(),
            "basic-auth needs both a username and a password"
        );
        assert_eq!(
            encode_flag("user:").unwrap_err(),
            "basic-auth needs both a username and a password"
        );
    }

    #[test]
    fn malformed_stored_values() {
        let e = |s: &str| Credential::parse(s).unwrap_err();
        assert_eq!(e("garbage"), "basic auth credential is not a sha256 value");
        assert_eq!(
            e("md5:00:00"),
            "basic auth credential is not a sha256 value"
        );
        assert_eq!(
            e("sha256:00"),
            "basic auth credential is missing its digest"
        );
        assert_eq!(
            e("sha256:zz:00"),
            "basic auth credential has an unreadable salt"
        );
        assert_eq!(
            e("sha256:00:00"),
            "basic auth credential has an unreadable salt"
        );
        let salt = "00".repeat(16);
        assert_eq!(
            e(&format!("sha256:{salt}:abcd")),
            "basic auth credential has an unreadable digest"
        );
        // A sign is not a hex digit (`+f` was read as 0x0f; found writing the property tests).
        assert_eq!(
            e(&format!("sha256:+0{}:{}", "00".repeat(15), "00".repeat(32))),
            "basic auth credential has an unreadable salt"
        );
        assert_eq!(
            e(&format!("sha256:{salt}:+0{}", "00".repeat(31))),
            "basic auth credential has an unreadable digest"
        );
    }

    #[test]
    fn the_gate_always_strips_the_header() {
        let gate = BasicAuth::new(Credential::parse(&encode_flag("u:p").unwrap()).unwrap());
        let mut h = auth_header("u", "p");
        assert!(gate.take_and_check(&mut h));
        assert!(h.get(header::AUTHORIZATION).is_none());
        let mut h = auth_header("u", "wrong");
        assert!(!gate.take_and_check(&mut h));
        assert!(h.is_empty());
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert!(!gate.take_and_check(&mut h));
        let mut h = auth_header("u", "p");
        assert!(!BasicAuth::deny_all().take_and_check(&mut h));
    }
}
