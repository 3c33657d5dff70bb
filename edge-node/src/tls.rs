//! TLS for MQTT listeners, on rustls 0.23 with the ring provider (the one provider of the whole
//! workspace). Certificates are read when the listener starts and on SIGHUP, never per
//! connection; the handshake runs in the connection's own task, not in the accept loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{ClientCertMode, TlsConfig};

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

/// Builds the server config for one listener from its files.
pub fn server_config(config: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = load_certs(&config.cert)?;
    let key = load_key(&config.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match (config.client_certs, &config.client_ca) {
        (ClientCertMode::Off, _) | (_, None) => builder.with_no_client_auth(),
        (mode, Some(ca)) => {
            let roots = Arc::new(load_roots(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider());
            let verifier = if mode == ClientCertMode::Optional { verifier.allow_unauthenticated() } else { verifier };
            let verifier =
                verifier.build().map_err(|e| TlsError::ClientCa { path: ca.clone(), reason: e.to_string() })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let server = builder.with_single_cert(certs, key).map_err(|e| TlsError::File {
        path: config.key.clone(),
        reason: format!("does not fit the certificate in {}: {e}", config.cert.display()),
    })?;
    Ok(Arc::new(server))
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
