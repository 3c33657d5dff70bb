//! Who writes an edge: its claim in the marks topic (`o/<edge>`), the last in the log wins.
//!
//! A bridge's producers are its own ([`super::pool`]), so a bridge taking an edge cannot fence
//! the one before by opening the same `transactional.id`. It takes the edge in three steps:
//! 1. it commits its claim, naming its producers' ids and those it must fence: the previous
//!    claim's producers, and, if that claim was never verified (its bridge died or lost the
//!    race before step 3), everything that claim had to fence too;
//! 2. it fences them: opening a producer of each id (`init_transactions`) aborts, or completes
//!    if its commit had begun, the transaction it had open, and refuses its commits from then
//!    on;
//! 3. it reads the marks settled ([`StateLog::read_settled`]): everything the fenced producers
//!    committed is read now, and they commit nothing more under that epoch. If the log's claim
//!    is still its own, the edge is its: it writes `v/<edge>` (verified) with its first write
//!    of the edge's state, so the next claimant fences only its producers.
//!
//! A fenced bridge opens its producers again, but writes for an edge only while the log shows
//! its own verified claim; the claim that fenced it was committed before the fence, and a
//! producer that opens reads the marks settled, so it sees that claim before any write. Two
//! bridges claiming at once both fence each other; the one whose claim the log shows last
//! keeps the edge, and the other's hello fails as fenced.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::log::StateLog;
use super::settings::KafkaSettings;
use super::txn::{close, open_producer, producer_config};
use crate::sink::SinkError;

/// A claim as the marks topic holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Claim {
    /// The claiming bridge's instance.
    pub(crate) owner: String,
    /// This claim among all of them: `<instance>/<n>`.
    pub(crate) token: String,
    /// The claiming bridge's producers.
    pub(crate) ids: Vec<String>,
    /// The producers it had to fence.
    #[serde(default)]
    pub(crate) fence: Vec<String>,
}

pub(crate) fn claim_key(edge: &str) -> String {
    format!("o/{edge}")
}

pub(crate) fn verified_key(edge: &str) -> String {
    format!("v/{edge}")
}

/// A claim of this bridge's that it verified.
#[derive(Clone)]
struct Verified {
    token: String,
    /// The claim as written.
    written: Arc<[u8]>,
}

/// This bridge's claims, and the fences it made.
pub(crate) struct Claims {
    settings: KafkaSettings,
    instance: String,
    ids: Vec<String>,
    marks: Arc<StateLog>,
    next: AtomicU64,
    /// Edges this bridge claimed and verified: the claim's token, and the claim as written (the
    /// log showing these bytes under the edge's claim key is the claim still holding, checked
    /// for every job without parsing).
    verified: Mutex<HashMap<String, Verified>>,
    /// Per producer id fenced: when its last fence started.
    fences: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Instant>>>>>,
}

impl Claims {
    pub(crate) fn new(settings: &KafkaSettings, instance: String, ids: Vec<String>, marks: Arc<StateLog>) -> Self {
        Self {
            settings: settings.clone(),
            instance,
            ids,
            marks,
            next: AtomicU64::new(1),
            verified: Mutex::default(),
            fences: Mutex::default(),
        }
    }

    /// This bridge's run.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// A token no other claim has.
    pub(crate) fn next_token(&self) -> String {
        format!("{}/{}", self.instance, self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// This bridge's producers' ids.
    pub(crate) fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The token of this bridge's claim of `edge`, if it holds it: claimed, verified, and the
    /// log shows no later claim.
    pub(crate) fn held(&self, edge: &str) -> Option<String> {
        let Verified { token, written } = self.verified.lock().unwrap_or_else(|e| e.into_inner()).get(edge).cloned()?;
        self.marks.is(&claim_key(edge), &written).then_some(token)
    }

    /// Records the claim of `edge` written as `value` under `token` as verified.
    pub(crate) fn verify(&self, edge: &str, token: String, value: &[u8]) {
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= 100_000 && !verified.contains_key(edge) {
            // Edges gone to other bridges need no entry.
            let marks = &self.marks;
            verified.retain(|e, v| marks.is(&claim_key(e), &v.written));
        }
        verified.insert(edge.to_owned(), Verified { token, written: value.into() });
    }

    /// Fences every producer of `ids`: each fenced by a fence that started after this was
    /// called (fences of one id asked for meanwhile are made once). Returns how many this call
    /// made.
    pub(crate) async fn fence(&self, ids: &[String]) -> Result<usize, SinkError> {
        let asked = Instant::now();
        let made = futures_util::future::try_join_all(ids.iter().map(|id| self.fence_one(id, asked))).await?;
        Ok(made.into_iter().filter(|m| *m).count())
    }

    async fn fence_one(&self, id: &str, asked: Instant) -> Result<bool, SinkError> {
        let slot = {
            let mut fences = self.fences.lock().unwrap_or_else(|e| e.into_inner());
            if fences.len() >= 4096 && !fences.contains_key(id) {
                fences.retain(|_, s| Arc::strong_count(s) > 1);
            }
            fences.entry(id.to_owned()).or_default().clone()
        };
        let mut last = slot.lock().await;
        if last.is_some_and(|started| started >= asked) {
            return Ok(false);
        }
        let started = Instant::now();
        match open_producer(producer_config(&self.settings, id)?, id).await {
            Ok(p) => close(p),
            // Its bridge opened it again after this fence: fenced all the same.
            Err(SinkError::Fenced { .. }) => {}
            Err(e) => return Err(e),
        }
        tracing::debug!(id, "kafka: producer fenced");
        *last = Some(started);
        Ok(true)
    }
}
