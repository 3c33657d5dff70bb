//! The downlink on the bridge: messages from the central cluster to edges' local MQTT topics.
//!
//! `cloud-bridge send` (or any NATS client, on JetStream) stores a message per edge in the sink
//! (`sink::downlink`). The bridge an edge is connected to reads that edge's messages after its
//! position and sends them on the session, in order, at most a window unanswered
//! ([`core::DownCore`], driven by the edge's session); the edge acks once each is durable on its side, and only then does
//! the bridge record the position (and the refusals, as dead letters) in the sink. Any bridge
//! serves any edge from there; a resend after a crash on either side is recognised by the
//! edge's own stored position.
//!
//! A session learns of new messages from the sink's news ([`Downlink::watch`], one reader per
//! bridge, waking the sessions of the edges named) and, in case news was lost, every
//! `downlink.poll`.

pub mod config;
pub mod core;
pub mod lines;
pub mod metrics;
pub mod send;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::sink::DownlinkStore;
use crate::sink::downlink::DownBounds;

/// Messages set aside per edge per summary, at most.
const TRIM_MAX: usize = 1000;
pub use config::DownlinkConfig;
pub use metrics::DownlinkMetrics;
use shared::units::now_ms;

/// The bridge's downlink: its config, its counters and the sessions news wakes.
#[derive(Debug)]
pub struct Downlink {
    pub config: DownlinkConfig,
    pub metrics: Arc<DownlinkMetrics>,
    /// Per connected edge, what wakes its session. One per edge: a newer session of an edge
    /// replaces the older's, which ends soon after.
    waiting: Mutex<HashMap<String, Arc<Notify>>>,
}

/// A session's place among those news wakes; leaving it (on drop) takes it out.
#[derive(Debug)]
pub struct Registration {
    downlink: Arc<Downlink>,
    edge: String,
    pub wake: Arc<Notify>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut waiting = self.downlink.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.get(&self.edge).is_some_and(|w| Arc::ptr_eq(w, &self.wake)) {
            waiting.remove(&self.edge);
        }
    }
}

impl Downlink {
    pub fn new(config: DownlinkConfig, metrics: Arc<DownlinkMetrics>) -> Self {
        Self { config, metrics, waiting: Mutex::default() }
    }

    /// Registers `edge`'s session for news of its messages.
    pub fn register(self: &Arc<Self>, edge: &str) -> Registration {
        let wake = Arc::new(Notify::new());
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(edge.to_owned(), wake.clone());
        Registration { downlink: self.clone(), edge: edge.to_owned(), wake }
    }

    fn wake_all(&self) {
        for w in self.waiting.lock().unwrap_or_else(|e| e.into_inner()).values() {
            w.notify_one();
        }
    }

    fn wake(&self, edges: &[String]) {
        let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        for edge in edges {
            if let Some(w) = waiting.get(edge) {
                w.notify_one();
            }
        }
    }

    /// Reads the sink's news until `stop`, waking the sessions of the edges it names, and the
    /// fleet's summary every `summary_interval` for the backlog gauges. A sink that fails is
    /// asked again after a pause; the sessions' own polls carry on meanwhile.
    pub async fn watch<S: DownlinkStore>(self: Arc<Self>, sink: Arc<S>, stop: CancellationToken) {
        let summaries = tokio::spawn(self.clone().summarize(sink.clone(), stop.clone()));
        let _summaries = tokio_util::task::AbortOnDropHandle::new(summaries);
        let mut cursor = None;
        let mut lost = false;
        loop {
            let news = tokio::select! {
                _ = stop.cancelled() => return,
                news = sink.down_news(cursor, Duration::from_secs(1)) => news,
            };
            match news {
                Ok((next, edges)) => {
                    cursor = Some(next);
                    if std::mem::take(&mut lost) {
                        // Back after the sink failed: every session reads once. A server that
                        // crashed may have lost its last messages and handed their sequences
                        // to new ones, which the cursor had passed already.
                        self.wake_all();
                    }
                    self.wake(&edges);
                }
                Err(e) => {
                    // The cursor is kept: what was stored meanwhile is news once the sink is back
                    // (from now on, it was not, and waited for the sessions' own polls).
                    tracing::debug!(error = %e, "downlink news unreadable; sessions poll meanwhile");
                    lost = true;
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    }
                }
            }
        }
    }

    /// Holds the edges connected here to their backlog bound: what any NATS client published
    /// past it (`send` checks it, other publishers do not) is set aside, newest first, up to
    /// [`TRIM_MAX`] per edge a pass. Only the bridge holding an edge's session trims it, so two
    /// bridges do not both take the newest away.
    async fn trim<S: DownlinkStore>(&self, sink: &S, edges: &[crate::sink::downlink::DownSummary]) {
        let bounds =
            DownBounds { messages: self.config.max_backlog_messages, bytes: self.config.max_backlog_bytes.bytes() };
        for e in edges.iter().filter(|e| e.waiting > bounds.messages) {
            if !self.waiting.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&e.edge) {
                continue;
            }
            match sink.down_trim(&e.edge, bounds, TRIM_MAX).await {
                Ok(0) => {}
                Ok(n) => {
                    self.metrics.trimmed.inc_by(n);
                    tracing::warn!(
                        edge = e.edge,
                        set_aside = n,
                        bound = bounds.messages,
                        "downlink messages published past the backlog bound set aside"
                    );
                }
                Err(e) => tracing::debug!(error = %e, "downlink backlog not trimmed"),
            }
        }
    }

    /// Sets the backlog gauges from the sink's summary every `summary_interval`.
    async fn summarize<S: DownlinkStore>(self: Arc<Self>, sink: Arc<S>, stop: CancellationToken) {
        let mut every = tokio::time::interval(self.config.summary_interval.0);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            match sink.down_summary().await {
                Ok(edges) => {
                    self.trim(sink.as_ref(), &edges).await;
                    let waiting: u64 = edges.iter().map(|e| e.waiting).sum();
                    let oldest = edges.iter().filter_map(|e| e.oldest_ms).min();
                    let age = oldest.map_or(0, |ms| now_ms().saturating_sub(ms) / 1000);
                    self.metrics.backlog.set(waiting.min(i64::MAX as u64) as i64);
                    self.metrics.oldest.set(age.min(i64::MAX as u64) as i64);
                }
                Err(e) => tracing::debug!(error = %e, "downlink summary unreadable; gauges kept"),
            }
        }
    }
}
