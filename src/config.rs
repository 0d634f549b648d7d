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

/// `$HOME/.config/kamal-proxy`, as upstream. Only computed here: the server creates and
/// checks it at start ([`prepare_data_dir`]); the CLI just names paths inside it.
pub fn data_dir() -> Result<PathBuf, String> {
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|home| PathBuf::from(home).join(".config").join("kamal-proxy"))
        .ok_or_else(|| {
            format!(
                "cannot determine the data directory: $HOME is not set (running as {})",
                current_user()
            )
        })
}

/// Creates the data directory (mode 0700) and proves it writable, so a volume the
/// proxy's user cannot write is a startup error naming the path and the user, rather
/// than services that vanish at the next restart. Upstream falls back to the temp dir;
/// we never do: state there would not survive the container.
/// `chosen` is `run --data-dir` (fork F31); empty means the default under `$HOME`.
pub fn prepare_data_dir(chosen: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = if chosen.is_empty() {
        data_dir()?
    } else {
        PathBuf::from(chosen)
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            format!(
                "cannot create the data directory {} (running as {}): {e}",
                dir.display(),
                current_user()
            )
        })?;
    tempfile::Builder::new()
        .prefix(".kamal-proxy-write-check")
        .tempfile_in(&dir)
        .map_err(|e| {
            format!(
                "the data directory {} is not writable (running as {}): {e}",
                dir.display(),
                current_user()
            )
        })?;
    Ok(dir)
}

pub const STATE_FILE_NAME: &str = "kamal-proxy.state";

/// Where the certificates of services that name no `--tls-acme-cache-path` live.
pub const CERTS_DIR_NAME: &str = "certs";

/// The socket the next proxy generation asks for this one's listeners (`run
/// --reuse-port`): in the data directory, because that is the volume two generations in
/// two containers share.
pub const HANDOVER_SOCKET_NAME: &str = "kamal-proxy.handover.sock";

/// The default ACME cache, computed by the client as upstream does; empty when there is
/// no home directory, which makes the server use its own default.
pub fn default_acme_cache_path() -> PathBuf {
    data_dir()
        .map(|d| d.join(CERTS_DIR_NAME))
        .unwrap_or_default()
}

/// `name (uid N)` of the process's user, for error messages about permissions.
pub fn current_user() -> String {
    // SAFETY: getuid cannot fail; getpwuid_r writes only into the buffers we pass.
    let uid = unsafe { libc::getuid() };
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = [0 as libc::c_char; 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc == 0 && !result.is_null() && !pwd.pw_name.is_null() {
        // SAFETY: on success pw_name points to a NUL-terminated string inside `buf`.
        let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
        format!("user {} (uid {uid})", name.to_string_lossy())
    } else {
        format!("uid {uid}")
    }
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
