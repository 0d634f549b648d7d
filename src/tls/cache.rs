//! The ACME cache on disk, in Go autocert's `DirCache` layout so a cache written by Go
//! kamal-proxy is reused here (and the other way round):
//! `<--tls-acme-cache-path>/<hex sha256 of the directory>/<domain>` holds the private key
//! PEM followed by the certificate chain PEM; `acme_account+key` holds the account key.
//! Directories are created with mode 0700, files written atomically with mode 0600.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Let's Encrypt production, autocert's default when no directory is configured.
pub const LETS_ENCRYPT_PRODUCTION: &str = "https://acme-v02.api.letsencrypt.org/directory";
pub const ACCOUNT_KEY_FILE: &str = "acme_account+key";

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DirCache {
    dir: PathBuf,
}

/// Upstream hashes the directory string it was given, the empty string for the default
/// (production) directory. The production URL given explicitly hashes the same way, so a
/// `--acme-directory` that names Let's Encrypt still finds an existing cache.
pub fn directory_hash(directory: &str) -> String {
    let key = if directory == LETS_ENCRYPT_PRODUCTION {
        ""
    } else {
        directory
    };
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, key.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

impl DirCache {
    pub fn new(cache_path: &Path, directory: &str) -> DirCache {
        DirCache {
            dir: cache_path.join(directory_hash(directory)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A cache entry's bytes; `None` when absent or unreadable (a miss, as autocert).
    pub fn get(&self, name: &str) -> Option<Vec<u8>> {
        let path = self.path(name)?;
        std::fs::read(path).ok()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.path(name).is_some_and(|p| p.is_file())
    }

    pub fn put(&self, name: &str, data: &[u8]) -> std::io::Result<()> {
        let path = self.path(name).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "invalid cache key")
        })?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let tmp = self.dir.join(format!(".{name}.tmp{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)
    }

    /// Names never escape the cache directory (autocert refuses the same).
    fn path(&self, name: &str) -> Option<PathBuf> {
        if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
            return None;
        }
        Some(self.dir.join(name))
    }
}

/// Splits an autocert cache entry into the private key (first PEM block) and the chain.
pub fn split_entry(
    data: &[u8],
) -> Option<(
    rustls_pki_types::PrivateKeyDer<'static>,
    Vec<rustls_pki_types::CertificateDer<'static>>,
)> {
    use rustls_pki_types::pem::PemObject;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(data).ok()?;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(data)
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    if certs.is_empty() {
        return None;
    }
    Some((key, certs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_upstream_cache_dirs() {
        assert_eq!(
            directory_hash(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(directory_hash(LETS_ENCRYPT_PRODUCTION), directory_hash(""));
        assert_eq!(
            directory_hash("https://acme-staging-v02.api.letsencrypt.org/directory"),
            "67f2750652314251daad76f012141d33c9f7290f4f8ebb0a006a7f02d394a904"
        );
    }

    #[test]
    fn put_get_and_modes() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let cache = DirCache::new(tmp.path(), "");
        assert!(cache.get("a.test").is_none());
        cache.put("a.test", b"data").unwrap();
        assert_eq!(cache.get("a.test").unwrap(), b"data");
        let mode = std::fs::metadata(cache.dir()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(cache.put("../x", b"no").is_err());
        assert!(cache.get("../x").is_none());
    }
}
