//! The CONNECT exchange: who the client is, whether it may connect, and the CONNECT the front
//! sends to the internal broker in its place.

use std::sync::Arc;

use bytes::BytesMut;
use rumqttd::protocol::{Login, Packet, Protocol, v4::V4, v5::V5};

use super::FrontContext;
use super::packet::{Version, reason};
use crate::auth::{Identity, Rules};

/// A CONNECT that passed authentication.
#[derive(Debug)]
pub(super) struct Admitted {
    pub identity: Identity,
    pub client_id: String,
    pub rules: Arc<Rules>,
    /// The CONNECT to send to the internal broker, carrying the internal secret.
    pub broker_connect: BytesMut,
}

/// Why a CONNECT is refused: the CONNACK codes to send and the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Refusal {
    pub v4_code: u8,
    pub v5_reason: u8,
    pub label: &'static str,
}

pub(super) const BAD_CREDENTIALS: Refusal =
    Refusal { v4_code: reason::V4_BAD_CREDENTIALS, v5_reason: reason::BAD_CREDENTIALS, label: "bad_credentials" };
pub(super) const NOT_AUTHORIZED: Refusal =
    Refusal { v4_code: reason::V4_NOT_AUTHORIZED, v5_reason: reason::NOT_AUTHORIZED, label: "not_authorized" };
pub(super) const MALFORMED: Refusal =
    Refusal { v4_code: reason::V4_SERVER_UNAVAILABLE, v5_reason: reason::MALFORMED, label: "malformed" };
pub(super) const MAX_CONNECTIONS: Refusal =
    Refusal { v4_code: reason::V4_SERVER_UNAVAILABLE, v5_reason: reason::QUOTA_EXCEEDED, label: "max_connections" };

/// Decides on a CONNECT frame. `cert_identity` is set when the TLS layer verified a client
/// certificate; it takes precedence over a username.
pub(super) async fn admit(
    frame: &[u8],
    version: Version,
    cert_identity: Option<Identity>,
    anonymous_allowed: bool,
    ctx: &FrontContext,
) -> Result<Admitted, Refusal> {
    let mut copy = BytesMut::from(frame);
    let packet = match version {
        Version::V311 => V4.read_mut(&mut copy, ctx.max_packet_size),
        Version::V5 => V5.read_mut(&mut copy, ctx.max_packet_size),
    };
    let Ok(Packet::Connect(connect, props, will, will_props, login)) = packet else {
        return Err(MALFORMED);
    };

    let identity = match (cert_identity, &login) {
        (Some(id), _) => id,
        (None, Some(login)) => verify_login(login, ctx).await?,
        (None, None) if anonymous_allowed => Identity::Anonymous,
        (None, None) => return Err(NOT_AUTHORIZED),
    };

    let rules = ctx.auth.load().rules_for(&identity, &connect.client_id);
    if let Some(will) = &will {
        let topic = std::str::from_utf8(&will.topic).map_err(|_| MALFORMED)?;
        if shared::topic::validate_name(topic).is_err() {
            return Err(MALFORMED);
        }
        if !rules.may_publish(topic) {
            tracing::info!(user = identity.name(), topic, "will topic refused by ACL");
            return Err(NOT_AUTHORIZED);
        }
    }

    let client_id = connect.client_id.clone();
    let login = Some(Login { username: identity.name().to_owned(), password: ctx.broker_secret.to_string() });
    let mut broker_connect = BytesMut::with_capacity(frame.len() + 64);
    // Always MQTT 5 towards the broker (see `compat`); a 3.1.1 CONNECT has no properties.
    let written = V5.write(Packet::Connect(connect, props, will, will_props, login), &mut broker_connect);
    written.map_err(|_| MALFORMED)?;
    Ok(Admitted { identity, client_id, rules, broker_connect })
}

async fn verify_login(login: &Login, ctx: &FrontContext) -> Result<Identity, Refusal> {
    let auth = ctx.auth.load_full();
    if auth.passwords.is_none() {
        return Err(BAD_CREDENTIALS);
    }
    let user = login.username.clone();
    let password = login.password.clone();
    let ok = tokio::task::spawn_blocking(move || {
        auth.passwords.as_ref().is_some_and(|p| p.verify(&user, password.as_bytes()))
    })
    .await
    .unwrap_or(false);
    if ok { Ok(Identity::User(login.username.clone())) } else { Err(BAD_CREDENTIALS) }
}
