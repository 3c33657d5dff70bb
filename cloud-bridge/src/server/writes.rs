//! A session's record writes, as its core orders them: each batch staged on a task of its own
//! as soon as the core lets it, then published on another once the core says its turn came.
//! Tasks, so a write goes on while the connection task awaits a mark or reads the next batch,
//! on the other core if there is one; they end with the connection.

use std::collections::HashMap;
use std::time::Instant;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio_util::task::AbortOnDropHandle;

use shared::trace::Tracer;

use super::core::{Publish, SessionCore};
use super::metrics::SessionMetrics;
use super::traced::SinkSpans;
use crate::limits::Reservation;
use crate::sink::{RecordSink, SinkError};

/// A write that ended: batch `id` staged, or published, or failed doing so.
pub(super) enum Written<T> {
    Staged(u64, Result<T, SinkError>),
    Published(u64, Result<(), SinkError>),
}

/// A batch under way: what it holds until it is in the sink, and its staging once done.
struct Batch<T> {
    held: Reservation,
    spans: Option<SinkSpans>,
    started: Instant,
    staged: Option<T>,
}

/// See the module doc.
pub(super) struct Writes<S: RecordSink> {
    running: FuturesUnordered<BoxFuture<'static, Written<S::Staged>>>,
    batches: HashMap<u64, Batch<S::Staged>>,
}

impl<S: RecordSink> Writes<S> {
    pub(super) fn new() -> Self {
        Self { running: FuturesUnordered::new(), batches: HashMap::new() }
    }

    /// The next write to end; pending while none runs.
    pub(super) async fn next(&mut self) -> Written<S::Staged> {
        match self.running.next().await {
            Some(written) => written,
            None => std::future::pending().await,
        }
    }

    /// A write that already ended, if any.
    pub(super) fn ready(&mut self) -> Option<Written<S::Staged>> {
        futures_util::FutureExt::now_or_never(self.running.next()).flatten()
    }

    /// Starts the stagings and the publish the core asks for.
    pub(super) fn start(&mut self, core: &mut SessionCore<Reservation>, sink: &S, edge: &str, tracer: &Tracer) {
        while let Some(Publish { id, epoch, lane, records, held }) = core.poll_stage() {
            let spans = SinkSpans::of(tracer, edge, &epoch, lane, &records);
            let stage = sink.stage(edge.to_owned(), epoch, lane, records);
            self.batches.insert(id, Batch { held, spans, started: Instant::now(), staged: None });
            self.spawn("stage", async move { Written::Staged(id, stage.await) }, move |e| Written::Staged(id, Err(e)));
        }
        while let Some((id, after)) = core.poll_publish() {
            let Some(staged) = self.batches.get_mut(&id).and_then(|b| b.staged.take()) else {
                // The core publishes only what it was told is staged. Were that ever broken, the
                // session ends on it, not with a panic of the connection's task.
                let e =
                    SinkError::Task { what: "publish", reason: format!("batch {id} published before it was staged") };
                self.running.push(Box::pin(std::future::ready(Written::Published(id, Err(e)))));
                continue;
            };
            // Called here, in the core's order, not in the task: a sink taking several at once
            // keeps the order it is called in.
            let publish = sink.publish_after(staged, after);
            self.spawn("publish", async move { Written::Published(id, publish.await) }, move |e| {
                Written::Published(id, Err(e))
            });
        }
    }

    fn spawn(
        &mut self,
        what: &'static str,
        write: impl Future<Output = Written<S::Staged>> + Send + 'static,
        lost: impl FnOnce(SinkError) -> Written<S::Staged> + Send + 'static,
    ) {
        let task = AbortOnDropHandle::new(tokio::spawn(write));
        self.running.push(Box::pin(async move {
            task.await.unwrap_or_else(|e| lost(SinkError::Task { what, reason: e.to_string() }))
        }));
    }

    /// Tells the core what ended; a failed write ends the session with its error.
    pub(super) fn handle(
        &mut self,
        written: Written<S::Staged>,
        core: &mut SessionCore<Reservation>,
        metrics: &SessionMetrics,
        tracer: &Tracer,
    ) -> Result<(), SinkError> {
        match written {
            Written::Staged(id, staged) => {
                let staged = staged?;
                if let Some(batch) = self.batches.get_mut(&id) {
                    batch.staged = Some(staged);
                }
                core.handle_staged(id);
            }
            Written::Published(id, result) => {
                // The records are in the sink (or not): their memory is free either way.
                let batch = self.batches.remove(&id);
                if let Some(Batch { held, spans, started, .. }) = batch {
                    metrics.sink_seconds.observe(started.elapsed().as_secs_f64());
                    if let Some(spans) = spans {
                        spans.record(tracer, result.is_ok());
                    }
                    drop(held);
                }
                result?;
                core.handle_published(id);
            }
        }
        Ok(())
    }
}
