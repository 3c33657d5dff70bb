//! TLS for MQTT listeners. Certificates are read when the listener starts and on SIGHUP, never
//! per connection; the handshake runs in the connection's own task, not in the accept loop.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use serde::{Deserialize, Serialize};
pub use shared::tls::{TlsError, certificate_expiry, certificate_identity, load_certs, load_key, load_roots, provider};

use shared::check::Problems;

/// A listener's `[listener.tls]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the server certificate chain, leaf first. Required.
    pub cert: PathBuf,
    /// PEM file with the server private key (PKCS#8, PKCS#1 or SEC1). Required.
    pub key: PathBuf,
    /// PEM file with the CA certificates client certificates are checked against. Required when
    /// `client_certs` is not `off`.
    pub client_ca: Option<PathBuf>,
    /// `off`: no client certificates; `optional`: verified when sent, and a verified certificate
    /// authenticates the client as its first DNS name (or CN); `required`: clients without a
    /// valid certificate fail the handshake. Default: `off`.
    #[serde(default)]
    pub client_certs: ClientCertMode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientCertMode {
    #[default]
    Off,
    Optional,
    Required,
}

impl TlsConfig {
    /// Checks the files; `key` is the section's key (`listener[0].tls`).
    pub fn check(&self, key: &str, p: &mut Problems) {
        p.file(format!("{key}.cert"), &self.cert);
        p.file(format!("{key}.key"), &self.key);
        match (&self.client_ca, self.client_certs) {
            (Some(ca), _) => p.file(format!("{key}.client_ca"), ca),
            (None, ClientCertMode::Off) => {}
            (None, mode) => {
                p.bad(format!("{key}.client_ca"), format!("required when client_certs = {mode:?}").to_lowercase())
            }
        }
    }
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
    let mut server = builder.with_single_cert(certs, key).map_err(|e| TlsError::File {
        path: config.key.clone(),
        reason: format!("does not fit the certificate in {}: {e}", config.cert.display()),
    })?;
    if config.client_certs != ClientCertMode::Off {
        // No resumption where a certificate is an identity: a resumed handshake takes the
        // client certificate from the first one, without checking it again (an expired or
        // revoked one would keep reconnecting).
        server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        server.send_tls13_tickets = 0;
    }
    Ok(Arc::new(server))
}
