//! What the bridge trusts, and a reload of it (SIGHUP, issue 29): its own certificate and key,
//! the fleet CA edges' certificates chain to, and the serials it refuses
//! (`server.deny_serials`). New handshakes take the new files at once; the live sessions of
//! serials newly denied are closed, as a refusal at the handshake closes them (code 2), so a
//! revoked certificate no longer needs a restart of every bridge. What else the config says
//! (the address, the limits' admission rates) takes a restart.
//!
//! It also keeps each edge id's live session, one at a time: a newer connection with the same
//! certificate id ends the older one, so one certificate (stolen, or a gateway cloned with its
//! keys) cannot hold sessions, streams and their memory many times over, and two sessions of
//! one edge never interleave marks on this bridge.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use super::ServerError;
use super::config::ServerConfig;

#[derive(Debug)]
pub(crate) struct Trust {
    deny: ArcSwap<HashSet<String>>,
    next: AtomicU64,
    live: Mutex<HashMap<String, Live>>,
}

#[derive(Debug)]
struct Live {
    ticket: u64,
    serial: String,
    ended: CancellationToken,
    denied: Arc<AtomicBool>,
}

/// A session's hold on its edge id: `ended` fires when a newer connection replaces it or its
/// certificate is denied (then [`Claim::denied`]).
#[derive(Debug)]
pub(crate) struct Claim {
    pub ticket: u64,
    pub ended: CancellationToken,
    denied: Arc<AtomicBool>,
}

impl Claim {
    pub(crate) fn denied(&self) -> bool {
        self.denied.load(Ordering::Acquire)
    }
}

impl Trust {
    pub(crate) fn new(deny_serials: &[String]) -> Self {
        Self {
            deny: ArcSwap::from_pointee(deny_serials.iter().cloned().collect()),
            next: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a certificate of this serial (hex, as `shared::tls::certificate_serial`) is
    /// refused.
    pub(crate) fn denied(&self, serial: &str) -> bool {
        self.deny.load().contains(serial)
    }

    /// Makes this connection `edge`'s live session, ending the one before.
    pub(super) fn claim(&self, edge: &str, serial: &str) -> Claim {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let (ended, denied) = (CancellationToken::new(), Arc::new(AtomicBool::new(false)));
        let live = Live { ticket, serial: serial.to_owned(), ended: ended.clone(), denied: denied.clone() };
        let mut sessions = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(older) = sessions.insert(edge.to_owned(), live) {
            older.ended.cancel();
        }
        drop(sessions);
        // A reload between the check at the handshake and here already denied it.
        if self.denied(serial) {
            denied.store(true, Ordering::Release);
            ended.cancel();
        }
        Claim { ticket, ended, denied }
    }

    /// Forgets `edge`'s session if it is still the one with `ticket`.
    pub(super) fn release(&self, edge: &str, ticket: u64) {
        let mut sessions = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if sessions.get(edge).is_some_and(|l| l.ticket == ticket) {
            sessions.remove(edge);
        }
    }

    /// Takes `serials` as the deny list and ends the live sessions of the certificates on it;
    /// the edge ids whose sessions it ended.
    pub(crate) fn deny(&self, serials: &[String]) -> Vec<String> {
        self.deny.store(Arc::new(serials.iter().cloned().collect()));
        let deny = self.deny.load();
        let sessions = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ended = Vec::new();
        for (edge, live) in sessions.iter().filter(|(_, l)| deny.contains(&l.serial)) {
            live.denied.store(true, Ordering::Release);
            live.ended.cancel();
            ended.push(edge.clone());
        }
        ended.sort();
        ended
    }
}

/// Reloads the bridge's trust from `config`: the certificate, key and fleet CA for new
/// handshakes on `endpoint`, and the deny list; the edge ids whose sessions it ended. Nothing
/// changes if a file cannot be used.
pub(crate) fn reload(
    endpoint: &quinn::Endpoint,
    trust: &Trust,
    config: &ServerConfig,
    limits: impl FnOnce(&mut quinn::TransportConfig),
) -> Result<Vec<String>, ServerError> {
    let server = super::server_config(config, limits)?;
    endpoint.set_server_config(Some(server));
    Ok(trust.deny(&config.deny_serials))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload ends the live session of a newly denied serial (and only it), marked denied; a
    /// claim after the list changed is denied at once; a newer connection of the same edge
    /// ends the older one as replaced, not denied.
    #[test]
    fn a_reload_ends_the_sessions_of_newly_denied_serials() {
        let trust = Trust::new(&["aa".into()]);
        assert!(trust.denied("aa") && !trust.denied("bb"));
        let (one, two) = (trust.claim("edge-1", "b1"), trust.claim("edge-2", "b2"));
        assert_eq!(trust.deny(&["b2".into()]), ["edge-2"]);
        assert!(!one.ended.is_cancelled());
        assert!(two.ended.is_cancelled() && two.denied());
        assert!(!trust.denied("aa"), "the list is replaced, not added to");
        let again = trust.claim("edge-2", "b2");
        assert!(again.ended.is_cancelled() && again.denied());
        let newer = trust.claim("edge-1", "b1-new");
        assert!(one.ended.is_cancelled() && !one.denied(), "replaced");
        trust.release("edge-1", one.ticket);
        assert!(!newer.ended.is_cancelled(), "releasing the older ticket leaves the newer");
    }
}
