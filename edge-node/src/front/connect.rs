//! Who a connecting client is: its verified certificate, its user name and password, or nobody
//! (on a listener that serves anonymous clients). The broker core takes it from there: client
//! id, session, will (whose topic the core checks against the same ACL rules).

use std::sync::Arc;

use crate::auth::{Identity, Login, Rules};
use crate::broker::codec::{Connect, reason};
use crate::broker::core;

use super::FrontContext;

/// A CONNECT refused before the core saw it: the MQTT 5 CONNACK reason and the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Refusal {
    pub code: u8,
    pub label: &'static str,
}

pub(super) const BAD_CREDENTIALS: Refusal = Refusal { code: reason::BAD_CREDENTIALS, label: "bad_credentials" };
pub(super) const NOT_AUTHORIZED: Refusal = Refusal { code: reason::NOT_AUTHORIZED, label: "not_authorized" };
pub(super) const MAX_CONNECTIONS: Refusal = Refusal { code: reason::QUOTA_EXCEEDED, label: "max_connections" };
pub(super) const LOGIN_BUSY: Refusal = Refusal { code: reason::SERVER_BUSY, label: "login_busy" };

/// Decides who the client is. `cert_identity` is set when the TLS layer verified a client
/// certificate; it takes precedence over a user name.
pub(super) async fn authenticate(
    connect: &Connect,
    cert_identity: Option<Identity>,
    anonymous_allowed: bool,
    ctx: &FrontContext,
) -> Result<Identity, Refusal> {
    match (cert_identity, &connect.username, &connect.password) {
        (Some(id), _, _) => Ok(id),
        // Many industrial clients always send a user name: on an anonymous listener with no
        // password file to check it against, the client is served anonymously, as Mosquitto
        // serves it, instead of refused for credentials nobody could verify.
        (None, Some(_), _) if anonymous_allowed && ctx.auth.load().passwords.is_none() => Ok(Identity::Anonymous),
        (None, Some(user), password) => verify_login(user, password.as_deref().unwrap_or_default(), ctx).await,
        // A password without a user name names nobody.
        (None, None, Some(_)) => Err(BAD_CREDENTIALS),
        (None, None, None) if anonymous_allowed => Ok(Identity::Anonymous),
        (None, None, None) => Err(NOT_AUTHORIZED),
    }
}

async fn verify_login(user: &str, password: &str, ctx: &FrontContext) -> Result<Identity, Refusal> {
    let Some(passwords) = ctx.auth.load().passwords.clone() else { return Err(BAD_CREDENTIALS) };
    match ctx.logins.check(passwords, user, password.as_bytes()).await {
        Login::Accepted => Ok(Identity::User(user.to_owned())),
        Login::Refused => Err(BAD_CREDENTIALS),
        Login::Busy => Err(LOGIN_BUSY),
    }
}

/// The identity as the core knows it: the owner of the sessions it makes, and its rules.
pub(super) fn core_identity(identity: &Identity, rules: Arc<Rules>) -> core::Identity {
    match identity {
        Identity::Internal => core::Identity { owner: "internal".into(), internal: true, rules: None },
        Identity::Anonymous => core::Identity { owner: "anonymous".into(), internal: false, rules: Some(rules) },
        Identity::User(name) => {
            core::Identity { owner: format!("user:{name}").into(), internal: false, rules: Some(rules) }
        }
        Identity::Certificate(name) => {
            core::Identity { owner: format!("cert:{name}").into(), internal: false, rules: Some(rules) }
        }
    }
}

/// The rules a session's owner ([`core_identity`]'s `owner`) has under `auth`: what a reload
/// gives every session, connected or not. An owner this build does not know gets no rights.
pub fn rules_of_owner(auth: &crate::auth::AuthState, owner: &str, client_id: &str) -> Arc<Rules> {
    let identity = match owner.split_once(':') {
        None if owner == "anonymous" => Identity::Anonymous,
        Some(("user", name)) => Identity::User(name.to_owned()),
        Some(("cert", name)) => Identity::Certificate(name.to_owned()),
        _ => return Arc::new(Rules::deny_all()),
    };
    auth.rules_for(&identity, client_id)
}
