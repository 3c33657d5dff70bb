//! The listeners at the node's start: each `[[listener]]`'s socket bound and its TLS loaded,
//! before anything is served, so a port taken or a certificate unreadable stops the start
//! naming the listener.

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::{Listener, ListenerConfig, ws};
use crate::tls::TlsError;

/// Why a listener did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    #[error("listener {name:?} cannot bind {addr}: {source}")]
    Bind {
        name: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("listener {name:?}: {source}")]
    Tls {
        name: String,
        #[source]
        source: TlsError,
    },
}

/// Every listener of `configs`, bound, in their order.
pub async fn bind(configs: &[ListenerConfig]) -> Result<Vec<(Arc<Listener>, TcpListener)>, BindError> {
    let mut out = Vec::new();
    for l in configs {
        let tls = match &l.tls {
            Some(t) => {
                let server =
                    crate::tls::server_config(t).map_err(|source| BindError::Tls { name: l.name.clone(), source })?;
                Some(ArcSwap::from_pointee(TlsAcceptor::from(server)))
            }
            None => None,
        };
        let socket = TcpListener::bind(l.bind).await.map_err(|source| BindError::Bind {
            name: l.name.clone(),
            addr: l.bind,
            source,
        })?;
        let listener = Listener {
            name: l.name.clone(),
            anonymous: l.anonymous,
            websocket: l.websocket,
            origins: ws::Origins::new(l.allowed_origins.clone()),
            tls,
        };
        out.push((Arc::new(listener), socket));
    }
    Ok(out)
}
