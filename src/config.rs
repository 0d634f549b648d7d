//! Where things live, following upstream's rules exactly, so a Kamal-managed volume and
//! `docker exec kamal-proxy kamal-proxy …` find the same socket and state file.

use std::path::PathBuf;

pub const ENV_PREFIX: &str = "KAMAL_PROXY_";

/// `KAMAL_PROXY_<key>` if it is set, else `<key>`. As upstream (Go's `os.LookupEnv`), a
/// variable that is set but empty still counts: `KAMAL_PROXY_HTTP_PORT=` means "the
/// default", not "look at `HTTP_PORT`".
pub fn env_value(key: &str) -> Option<String> {
    [format!("{ENV_PREFIX}{key}"), key.to_string()]
        .into_iter()
        .find_map(|k| std::env::var_os(&k))
        .map(|v| v.to_string_lossy().into_owned())
}

/// An environment default for an integer flag. Like upstream, an unparseable value falls
/// back to the built-in default rather than failing.
pub fn env_int<T: std::str::FromStr>(key: &str, default: T) -> T {
    env_value(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An environment default for a boolean flag, with Go's `strconv.ParseBool` spellings.
pub fn env_bool(key: &str, default: bool) -> bool {
    env_value(key)
        .and_then(|v| parse_go_bool(&v).ok())
        .unwrap_or(default)
}

pub fn parse_go_bool(v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "strconv.ParseBool: parsing \"{v}\": invalid syntax"
        )),
    }
}

fn temp_dir() -> PathBuf {
    std::env::var_os("TMPDIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// `$KAMAL_PROXY_SOCKET`, else `$XDG_RUNTIME_DIR/kamal-proxy.sock`, else the temp dir.
pub fn socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("KAMAL_PROXY_SOCKET").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(temp_dir);
    dir.join("kamal-proxy.sock")
}

/// `$HOME/.config/kamal-proxy`, created with mode 0700; the temp dir when that fails.
pub fn data_dir() -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(home).join(".config").join("kamal-proxy");
        if std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .is_ok()
        {
            return dir;
        }
    }
    temp_dir()
}

pub fn state_file_path() -> PathBuf {
    data_dir().join("kamal-proxy.state")
}

/// The default ACME cache, computed by the client as upstream does.
pub fn default_acme_cache_path() -> PathBuf {
    data_dir().join("certs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false));
        }
        assert!(parse_go_bool("yes").is_err());
    }
}
