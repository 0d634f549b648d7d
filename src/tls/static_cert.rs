//! `--tls-certificate-path` / `--tls-private-key-path`: PEM files read at deploy (and on
//! restore), served for every name routed to the service, as upstream.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;

use super::cert::ServedCert;

pub fn load(cert_path: &Path, key_path: &Path) -> Result<ServedCert, String> {
    let chain = CertificateDer::pem_file_iter(cert_path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", cert_path.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate found", cert_path.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| format!("{}: {e}", key_path.display()))?;
    ServedCert::new(key, chain)
}
