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

/// The serial number of a certificate as its integer value in lowercase hex, without
/// separators or leading zeros (what [`canonical_serial`] makes of a deny-list entry), or `None`
/// if it does not parse. DER gives a serial with its high bit set a leading `00` byte, which
/// `openssl x509 -serial` does not print; comparing those bytes let such a certificate past a
/// deny list holding what openssl printed.
pub fn certificate_serial(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let hex: String = parsed.raw_serial().iter().map(|b| format!("{b:02x}")).collect();
    canonical_serial(&hex)
}

/// The first moment a certificate is no longer valid: the second after its `notAfter` (RFC
/// 5280 counts `notAfter` itself as valid, and so does a handshake's check), or `None` if it
/// does not parse. A session authenticated by it ends then: TLS checks the dates only at the
/// handshake.
pub fn certificate_expiry(cert: &CertificateDer<'_>) -> Option<std::time::SystemTime> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let secs = parsed.validity().not_after.timestamp().saturating_add(1);
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
}

/// A serial number as an operator writes it (`openssl x509 -serial` prints `serial=80D0...`;
/// others write `80:d0:...` or `0x80d0...`), as its integer value in lowercase hex without
/// leading zeros; `None` if it is not hexadecimal.
pub fn canonical_serial(text: &str) -> Option<String> {
    let t = text.trim();
    let t = t.strip_prefix("serial=").unwrap_or(t);
    let t = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    let digits: String = t.chars().filter(|c| *c != ':').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let value = digits.trim_start_matches('0').to_ascii_lowercase();
    Some(if value.is_empty() { "0".into() } else { value })
}

#[cfg(test)]
mod tests {
    use super::canonical_serial;

    #[test]
    fn serials_compare_by_value_whatever_their_spelling() {
        let value = Some("80d0aa01".to_owned());
        for spelling in ["serial=80D0AA01", "80:D0:AA:01", "0080d0aa01", "0x80d0aa01", " 00:80:d0:aa:01 "] {
            assert_eq!(canonical_serial(spelling), value, "{spelling}");
        }
        assert_eq!(canonical_serial("00"), Some("0".into()));
        for bad in ["", "serial=", "zz", "80-d0", "0x"] {
            assert_eq!(canonical_serial(bad), None, "{bad:?}");
        }
    }
}
