//! How a batch is published: its messages built and, where the server allows it, staged
//! ahead of its turn ([`Publisher::stage`]); then published one of three ways (see
//! [`Publishing`]), retried for the moment's failures and, when JetStream refuses a record for
//! itself, message by message with the refused ones set aside ([`Publisher::publish`]). Each
//! way keeps the order per topic when a publish fails part way: what is stored of a batch is a
//! prefix of it, or, message by message, a prefix per subject.

use std::sync::Arc;

use async_nats::jetstream;
use serde::{Deserialize, Serialize};
use shared::proto::WireRecord;

use super::outgoing::{self, Outgoing, readdress, triples};
use super::refused::{self, Failure};
use super::{atomic, fast};
use crate::sink::{Retry, SinkError, SinkMetrics};

/// How batches are published, from the config's wish and what the server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchPublish {
    /// The fastest the server has: fast ingest, else atomic batches, else message by message.
    #[default]
    Auto,
    /// Fast-ingest batches (nats-server 2.14 or newer).
    Fast,
    /// Atomic batches (nats-server 2.12 or newer).
    Atomic,
    /// Message by message.
    Off,
}

impl BatchPublish {
    /// As the config names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BatchPublish::Auto => "auto",
            BatchPublish::Fast => "fast",
            BatchPublish::Atomic => "atomic",
            BatchPublish::Off => "off",
        }
    }
}

/// The way a sink publishes, chosen once at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Publishing {
    /// ADR-50 fast ingest (`fast.rs`): a batch lost part way leaves a prefix. It costs the
    /// server less than an atomic batch, which it stages and then applies.
    Fast,
    /// ADR-50 atomic batches (`atomic.rs`): stored all together or not at all.
    Atomic,
    /// Per subject one publish in flight.
    Messages,
}

impl Publishing {
    /// As the logs name it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Publishing::Fast => "fast",
            Publishing::Atomic => "atomic",
            Publishing::Messages => "messages",
        }
    }

    /// The best of what `wish` allows that a server of `version` has.
    pub(super) fn choose(wish: BatchPublish, version: &str) -> Self {
        let mut parts = version.split(['.', '-']).map(|p| p.parse::<u64>().unwrap_or(0));
        let at = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        let (fast, atomic) = (at >= (2, 14), at >= (2, 12));
        match wish {
            BatchPublish::Auto | BatchPublish::Fast if fast => Self::Fast,
            BatchPublish::Auto | BatchPublish::Fast | BatchPublish::Atomic if atomic => Self::Atomic,
            _ => Self::Messages,
        }
    }
}

/// What publishing needs of the sink, owned, so a publish runs on a task of its own.
#[derive(Debug, Clone)]
pub(super) struct Publisher {
    pub(super) client: async_nats::Client,
    pub(super) js: jetstream::Context,
    pub(super) publishing: Publishing,
    pub(super) prefix: String,
    pub(super) metrics: Arc<SinkMetrics>,
    /// The server's `max_payload`: a message over it is refused for itself before it is sent.
    pub(super) max_payload: usize,
}

/// A batch of one edge's lane, its messages built and what could be staged ahead of its turn.
#[derive(Debug)]
pub struct Staged {
    edge: String,
    epoch: String,
    lane: u8,
    /// The records, their payloads moved into `messages`: what a message is addressed from
    /// again after a publish took its subject and headers.
    records: Vec<WireRecord>,
    messages: Vec<Outgoing>,
    ahead: Ahead,
}

/// What the first attempt at a batch has done before its turn.
#[derive(Debug)]
enum Ahead {
    Nothing,
    /// All of the first atomic batch but its last message, staged under this batch id.
    Atomic(String),
    /// The fast batch's reply subscription.
    Fast(fast::Replies),
}

impl Publisher {
    /// `records` made ready: their messages built (here, on the publish's own task, while the
    /// batch ahead is still waiting for JetStream) and, for an atomic batch, staged with the
    /// server; a fast batch subscribes to its replies. A staging the moment refuses is left to
    /// [`Publisher::publish`].
    pub(super) async fn stage(
        &self,
        edge: String,
        epoch: String,
        lane: u8,
        mut records: Vec<WireRecord>,
    ) -> Result<Staged, SinkError> {
        let mut messages = outgoing::outgoing(&self.prefix, &edge, &epoch, lane, &mut records)?;
        let ahead = match self.publishing {
            _ if self.oversized(&messages) => Ahead::Nothing,
            Publishing::Atomic => {
                match atomic::stage(&self.client, &mut messages[..atomic::MAX_ATOMIC.min(records.len())]).await {
                    Ok(id) => Ahead::Atomic(id),
                    Err(_) => {
                        // Tried again whole by the publish, with the subjects and headers back.
                        readdress(&mut messages, &records, |r| {
                            outgoing::addressed(&self.prefix, &edge, &epoch, lane, r)
                        });
                        Ahead::Nothing
                    }
                }
            }
            Publishing::Fast => fast::subscribe(&self.client).await.map_or(Ahead::Nothing, Ahead::Fast),
            Publishing::Messages => Ahead::Nothing,
        };
        Ok(Staged { edge, epoch, lane, records, messages, ahead })
    }

    /// A message over the server's limit would fail any batch it is in, every time.
    fn oversized(&self, messages: &[Outgoing]) -> bool {
        messages.iter().any(|m| m.size() > self.max_payload)
    }

    /// Publishes `staged`, retrying the moment's failures with backoff; a batch JetStream
    /// refuses for a record in it goes again message by message, the refused ones set aside.
    pub(super) async fn publish(&self, staged: Staged) -> Result<(), SinkError> {
        let Staged { edge, epoch, lane, records, mut messages, mut ahead } = staged;
        let (metrics, max_payload) = (&*self.metrics, self.max_payload);
        let dead = refused::dead_subject(&self.prefix, &edge);
        let address = |r: &WireRecord| outgoing::addressed(&self.prefix, &edge, &epoch, lane, r);
        let mut retry = Retry::default();
        let oversized = self.oversized(&messages);
        loop {
            let result = match (self.publishing, std::mem::replace(&mut ahead, Ahead::Nothing)) {
                _ if oversized => {
                    Err(Failure::Record { reason: "too_large", detail: format!("over max_payload {max_payload}") })
                }
                (Publishing::Fast, ahead) => {
                    let replies = if let Ahead::Fast(r) = ahead { Some(r) } else { None };
                    fast::publish(&self.client, &mut messages, replies).await
                }
                (Publishing::Atomic, ahead) => {
                    let staged = if let Ahead::Atomic(id) = ahead { Some(id) } else { None };
                    let aside = (dead.as_str(), metrics);
                    atomic::publish(&self.client, &self.js, &mut messages, &records, address, staged, aside).await
                }
                (Publishing::Messages, _) => publish_messages(&self.js, &mut messages, (&dead, metrics)).await,
            };
            let result = match result {
                // A batch is refused whole: message by message, the refused ones set aside.
                Err(Failure::Record { reason, detail }) => {
                    tracing::info!(
                        edge,
                        lane,
                        reason,
                        detail,
                        "batch refused for a record in it; publishing it message by message"
                    );
                    readdress(&mut messages, &records, address);
                    publish_messages(&self.js, &mut messages, (&dead, metrics)).await
                }
                other => other,
            };
            match result {
                Ok(()) => {
                    metrics.wrote();
                    return Ok(());
                }
                Err(Failure::Transient(e)) => {
                    retry.wait("publish", &e, metrics).await;
                    readdress(&mut messages, &records, address);
                }
                Err(e) => {
                    // Not the moment's: the session ends on it, and `/healthz` says so.
                    let e = e.into_error();
                    metrics.failed(&e);
                    return Err(e);
                }
            }
        }
    }
}

/// Publishes `messages` message by message, per subject one at a time (a failure leaves a
/// prefix per subject), setting aside what JetStream refuses for itself.
async fn publish_messages(
    js: &jetstream::Context,
    messages: &mut [Outgoing],
    aside: (&str, &SinkMetrics),
) -> Result<(), Failure> {
    refused::publish_setting_aside(js, triples(messages), aside.0, aside.1).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_publishing_follows_the_server_version() {
        use BatchPublish::*;
        assert_eq!(Publishing::choose(Auto, "2.15.1"), Publishing::Fast);
        assert_eq!(Publishing::choose(Auto, "2.14.0"), Publishing::Fast);
        assert_eq!(Publishing::choose(Auto, "3.0.0-beta"), Publishing::Fast);
        assert_eq!(Publishing::choose(Auto, "2.12.3"), Publishing::Atomic);
        assert_eq!(Publishing::choose(Fast, "2.13.0"), Publishing::Atomic);
        assert_eq!(Publishing::choose(Atomic, "2.15.1"), Publishing::Atomic);
        assert_eq!(Publishing::choose(Atomic, "2.11.9"), Publishing::Messages);
        assert_eq!(Publishing::choose(Auto, "2.10.22"), Publishing::Messages);
        assert_eq!(Publishing::choose(Off, "2.15.1"), Publishing::Messages);
        assert_eq!(Publishing::choose(Auto, "garbage"), Publishing::Messages);
    }
}
