//! Hints of new downlink messages, so the news watch reads the stream as soon as one is
//! published instead of at its next poll (`NEWS_POLL`: 50 ms of latency on average, 100 at
//! worst, on every message).
//!
//! A core NATS subscription to the downlink's subjects, on a connection of its own, made on
//! the first look for news (a `send` never looks). It only says "look now": the stream is
//! still read through the JSON API alone, and a hint lost (a slow subscription, a reconnect)
//! costs only the poll it saved.
//!
//! - Its own connection: async-nats drops the connection a message with a subject or headers
//!   that are not UTF-8 arrives on, and any NATS client that can publish to the downlink's
//!   subjects can send one. That is then this connection, which is made again while news goes
//!   on polling; the connection the bridge writes and reads with never sees these messages.
//! - A hint may come before the stream stored its message: the watch then looks again a few
//!   times within a few milliseconds before it waits again.
//! - Its queue is bounded ([`CAPACITY`] messages): past it, async-nats drops what comes
//!   (hints, all alike), and the poll covers them.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;

use crate::sink::SinkError;
use crate::sink::jetstream::cluster;

/// Messages the subscription holds before it drops.
const CAPACITY: usize = 256;
/// The wait before the subscription is made again after it failed or ended.
const AGAIN: Duration = Duration::from_secs(1);

/// The hints of one downlink stream's subjects.
#[derive(Debug)]
pub(in crate::sink) struct Hints {
    heard: Arc<Notify>,
    _listen: AbortOnDropHandle<()>,
}

impl Hints {
    /// Subscribes to `subjects` on the servers of `url`, from now on, until dropped.
    pub(super) fn start(url: String, subjects: String) -> Self {
        let heard = Arc::new(Notify::new());
        let notify = heard.clone();
        let listen = tokio::spawn(async move {
            loop {
                if let Err(e) = listen(&url, &subjects, &notify).await {
                    tracing::debug!(error = %e, "downlink hints unavailable; news polls meanwhile");
                }
                tokio::time::sleep(AGAIN).await;
            }
        });
        Self { heard, _listen: AbortOnDropHandle::new(listen) }
    }

    /// Waits for a hint, at most `max`: whether one came.
    pub(super) async fn wait(&self, max: Duration) -> bool {
        tokio::time::timeout(max, self.heard.notified()).await.is_ok()
    }
}

async fn listen(url: &str, subjects: &str, heard: &Notify) -> Result<(), SinkError> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(3))
        .subscription_capacity(CAPACITY)
        .connect(cluster::servers(url)?)
        .await
        .map_err(|e| SinkError::nats("downlink hints", url, &e))?;
    let mut sub =
        client.subscribe(subjects.to_owned()).await.map_err(|e| SinkError::nats("downlink hints", subjects, &e))?;
    // Its payload is not needed, nor kept.
    while sub.next().await.is_some() {
        heard.notify_one();
    }
    Ok(())
}
