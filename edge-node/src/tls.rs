//! TLS for MQTT listeners. Certificates are read when the listener starts and on SIGHUP, never
//! per connection; the handshake runs in the connection's own task, not in the accept loop.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
pub use shared::tls::{TlsError, certificate_identity, load_certs, load_key, load_roots, provider};

use crate::config::{ClientCertMode, TlsConfig};

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
