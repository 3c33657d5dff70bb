//! Certificate files and identities, shared by the edge's listeners and uplink and by the
//! cloud bridge: rustls 0.23 with the ring provider, the one provider of the whole workspace.
//! Behind the `tls` feature.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

/// What a certificate is for: the role its extended key usage must allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Presented by a TLS client (an edge to its bridge, an MQTT client to the edge).
    Client,
    /// Presented by a TLS server (a bridge, an edge's TLS listener).
    Server,
}

/// What [`check_pair`] found of a certificate and key that can be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PairReport {
    /// The certificate's name ([`certificate_identity`]).
    pub name: Option<String>,
    /// Its `notAfter`.
    pub not_after: std::time::SystemTime,
}

/// Checks a certificate and key as a process would load them at start, and more: both parse,
/// the key is the certificate's, the certificate is valid now and made for `role` (a swapped
/// client and server certificate is caught here, not at the first handshake). The error names
/// the file and what is wrong.
pub(crate) fn check_pair(
    cert: &Path,
    key: &Path,
    role: Role,
    now: std::time::SystemTime,
) -> Result<PairReport, TlsError> {
    let chain = load_certs(cert)?;
    let der = load_key(key)?;
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| TlsError::File { path: key.to_owned(), reason: format!("unusable private key: {e}") })?;
    let bad = |reason: String| TlsError::File { path: cert.to_owned(), reason };
    rustls::sign::CertifiedKey::new(chain.clone(), signing)
        .keys_match()
        .map_err(|e| bad(format!("is not the certificate of the key {}: {e}", key.display())))?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(chain[0].as_ref()).map_err(|e| bad(format!("cannot parse: {e}")))?;
    let validity = parsed.validity();
    let at = |t: &x509_parser::time::ASN1Time| {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
    };
    let (not_before, not_after) = (at(&validity.not_before), at(&validity.not_after));
    let utc = |t: std::time::SystemTime| humantime::format_rfc3339_seconds(t).to_string();
    if now < not_before {
        return Err(bad(format!("not valid before {}", utc(not_before))));
    }
    if now > not_after {
        return Err(bad(format!("expired at {}", utc(not_after))));
    }
    if let Ok(Some(eku)) = parsed.extended_key_usage() {
        let eku = &eku.value;
        let (allowed, what) = match role {
            Role::Client => (eku.any || eku.client_auth, "client (clientAuth)"),
            Role::Server => (eku.any || eku.server_auth, "server (serverAuth)"),
        };
        if !allowed {
            let other = if eku.server_auth {
                "a server certificate"
            } else if eku.client_auth {
                "a client certificate"
            } else {
                "not"
            };
            return Err(bad(format!("is {other}; here it must be a {what} certificate")));
        }
    }
    Ok(PairReport { name: certificate_identity(&chain[0]), not_after })
}

/// Certificates closer to their `notAfter` than this are named by `check-config`.
pub(crate) const EXPIRY_WARNING: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// `check-config`'s word on a certificate and key named by `key` in a config: an error, a
/// warning when it expires within [`EXPIRY_WARNING`], or nothing.
pub fn config_check(key: &str, cert: &Path, pem_key: &Path, role: Role) -> Result<Option<String>, String> {
    let now = std::time::SystemTime::now();
    let report = check_pair(cert, pem_key, role, now).map_err(|e| format!("{key}: {e}"))?;
    let left = report.not_after.duration_since(now).unwrap_or_default();
    Ok((left < EXPIRY_WARNING).then(|| {
        format!(
            "{key}: {} expires in {} days ({})",
            cert.display(),
            left.as_secs() / 86_400,
            humantime::format_rfc3339_seconds(report.not_after)
        )
    }))
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
