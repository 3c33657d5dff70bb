//! Certificate files and identities, shared by the edge's listeners and uplink and by the
//! cloud bridge: rustls 0.23 with the ring provider, the one provider of the whole workspace.
//! Behind the `tls` feature.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA {path}: {reason}")]
    ClientCa { path: PathBuf, reason: String },
}

/// The crypto provider used everywhere: ring, which cross-compiles with a plain C compiler.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |reason: String| TlsError::File { path: path.to_owned(), reason };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("cannot read certificates: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE block found".into()));
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        path: path.to_owned(),
        reason: format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM expected): {e}"),
    })
}

pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::ClientCa { path: path.to_owned(), reason: e.to_string() })?;
    }
    Ok(roots)
}

/// The name a verified client certificate stands for: its first DNS subject alternative name,
/// or its subject CN when it has none.
pub fn certificate_identity(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                return Some((*dns).to_owned());
            }
        }
    }
    parsed.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_owned)
}

/// The serial number of a certificate as lowercase hex without separators (what deny-lists
/// hold), or `None` if it does not parse.
pub fn certificate_serial(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(parsed.raw_serial().iter().map(|b| format!("{b:02x}")).collect())
}
