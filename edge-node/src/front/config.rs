//! `[[listener]]`: where the front accepts MQTT clients, and each listener's own check.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::tls::{ClientCertMode, TlsConfig};
use shared::check::Problems;

/// One MQTT listener (plain TCP or TLS; MQTT 3.1.1 and 5 on the same port).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Name used in logs and metrics labels. Required.
    pub name: String,
    /// Address to bind, e.g. `127.0.0.1:1883`; port 0 picks a free port. Required.
    pub bind: SocketAddr,
    /// Serve clients that send no credentials. Only allowed on a loopback `bind`, as in
    /// Mosquitto 2. Default: false.
    #[serde(default)]
    pub anonymous: bool,
    /// TLS for this listener. Absent: plain TCP.
    pub tls: Option<TlsConfig>,
    /// MQTT over WebSocket (subprotocol `mqtt`, any path), for browser dashboards; with
    /// `[listener.tls]` it is `wss`. Same authentication, ACL and limits. Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub websocket: bool,
    /// On a `websocket` listener, the browser origins (the handshake's `Origin`) served: exact
    /// `scheme://host[:port]` values, or `"*"` for any. Default: pages of this host only
    /// (`http` or `https` on `localhost`, `127.0.0.1` or `[::1]`, any port), so a page from
    /// elsewhere opened in a browser on the gateway (a kiosk, a dashboard) cannot use the
    /// listener's rights; it gets 403. Clients that are not browsers send no `Origin` and are
    /// served as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_origins: Option<Vec<String>>,
}

/// The listeners when the file names none: one anonymous listener on `127.0.0.1:1883`.
pub fn default_listeners() -> Vec<ListenerConfig> {
    vec![ListenerConfig {
        name: "local".to_owned(),
        bind: SocketAddr::from(([127, 0, 0, 1], 1883)),
        anonymous: true,
        tls: None,
        websocket: false,
        allowed_origins: None,
    }]
}

/// Checks every listener: names and addresses unique, anonymous only on loopback, TLS files.
/// `passwords` says whether `[auth]` has a password file, without which a listener that is not
/// anonymous needs client certificates.
pub fn check_listeners(listeners: &[ListenerConfig], passwords: bool, p: &mut Problems) {
    if listeners.is_empty() {
        p.bad("listener", "at least one [[listener]] is needed");
    }
    for (i, l) in listeners.iter().enumerate() {
        let key = format!("listener[{i}]");
        if listeners[..i].iter().any(|o| o.name == l.name) {
            p.bad(format!("{key}.name"), format!("{:?} is used by another listener", l.name));
        }
        if listeners[..i].iter().any(|o| o.bind == l.bind && l.bind.port() != 0) {
            p.bad(format!("{key}.bind"), format!("{} is used by another listener", l.bind));
        }
        if l.anonymous && !l.bind.ip().is_loopback() {
            p.bad(
                format!("{key}.anonymous"),
                format!(
                    "anonymous clients are only served on loopback addresses, and {} is not one; use a password file or client certificates",
                    l.bind
                ),
            );
        }
        let client_certs = l.tls.as_ref().is_some_and(|t| t.client_certs != ClientCertMode::Off);
        if !l.anonymous && !passwords && !client_certs {
            p.bad(
                key.clone(),
                "no client could log in: it is not anonymous, auth.password_file is not set and it takes no client certificates",
            );
        }
        if let Some(tls) = &l.tls {
            tls.check(&format!("{key}.tls"), p);
        }
        match (&l.allowed_origins, l.websocket) {
            (Some(_), false) => p.bad(format!("{key}.allowed_origins"), "only a websocket listener has origins"),
            (Some(origins), true) => {
                for o in origins.iter().filter(|o| *o != "*") {
                    let ok = o.split_once("://").is_some_and(|(scheme, rest)| {
                        matches!(scheme, "http" | "https") && !rest.is_empty() && !rest.contains('/')
                    });
                    if !ok {
                        p.bad(
                            format!("{key}.allowed_origins"),
                            format!("{o:?} is not an origin: scheme://host[:port], or \"*\""),
                        );
                    }
                }
            }
            (None, _) => {}
        }
    }
}
