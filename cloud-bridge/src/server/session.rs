//! One edge session's connection task: the driver of [`SessionCore`]. It reads control frames
//! and batches (each by a task of its own), asks the sink what the hello needs, runs the
//! publishes and marks the core asks for, and sends what the core queued for the edge. What
//! to do and when is the core's; this is I/O.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::proto::cloud::{CloudSession, DownWindow};
use shared::proto::io::{FrameIoError, write_frame};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use crate::downlink::Registration;
use crate::downlink::core::{DownAnswer, DownCall, DownCore};

use super::core::{Answer, Call, CoreError, Event, SessionCore};
use super::metrics::SessionMetrics as Metrics;
use super::writes::Writes;
use super::{Services, SessionEnd, SessionLimits, refuse};
use crate::fleet::Presence;
use crate::ingest::{self, Dicts, Ingested};
use crate::limits::Reservation;
use crate::models::serve::EdgeModels;
use crate::sink::{Sink, SinkError};

/// Runs the session until the edge closes it (`Ok`) or something ends it (why).
///
/// The session's state lives in its connection's task for as long as the edge is connected:
/// the sink's futures, large and awaited rarely (the hello, dictionaries, marks), are boxed so
/// they do not size that state for every idle edge.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run<S: Sink>(
    conn: &quinn::Connection,
    edge: &str,
    limits: SessionLimits,
    sink: &S,
    services: &Services,
    metrics: &Metrics,
    presence: &mut Presence,
    lag: &mut i64,
) -> Result<(), SessionEnd> {
    let (models, tracer) = (services.models.as_ref(), &services.tracer);
    let (mut send, recv) = conn.accept_bi().await?;
    let config = &services.downlink.config;
    let window = DownWindow { messages: config.window_messages, bytes: config.window_bytes.as_usize() };
    let session = CloudSession::new(limits.max_held).with_down_window(window);
    let down = DownCore::new(edge, services.downlink.metrics.clone(), config.poll.0)
        .with_max_bytes(config.max_message_bytes.bytes())
        .with_short_reads(sink.down_limit().reach.is_some());
    let mut core: SessionCore<Reservation> = SessionCore::new(session, sink.pipeline(), limits.stall)
        .with_publish_ahead(sink.publish_ahead())
        .with_edge(edge, Some(down));
    // What wakes the edge's downlink when news of its messages comes, once it runs.
    let mut news: Option<Registration> = None;
    // Control frames and batches are read by their own tasks: a read cut short by `select!`
    // would lose the bytes it had taken. Both are paid from the connection's memory.
    let (mut control_rx, reader) = ingest::spawn_control_reader(recv, limits.budget.clone());
    let _reader = AbortOnDropHandle::new(reader);
    // Batches are read, paid for and decoded by a task of their own, in stream order.
    let dicts = Arc::new(Dicts::default());
    let (batch_tx, mut batch_rx) = mpsc::channel(1);
    // Chunks served to the edge are paid from the same memory as its batches.
    let chunk_budget = limits.budget.clone();
    let _ingest = AbortOnDropHandle::new(tokio::spawn(ingest::run(
        conn.clone(),
        limits.budget,
        dicts.clone(),
        services.framer.clone(),
        batch_tx,
    )));
    // The batches staged and published, in the order the core asks.
    let mut writes: Writes<S> = Writes::new();
    // The models this edge follows, once its hello named them, and their chunk server.
    let mut edge_models: Option<(EdgeModels, AbortOnDropHandle<()>)> = None;
    let mut model_poll = tokio::time::interval(models.map_or(Duration::from_secs(3600), |m| m.poll));
    model_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The downlink's sink call in flight: made beside the session's frames and batches, so a
    // slow or failing downlink holds up nothing else.
    let mut down_call: Option<DownFuture<'_>> = None;
    loop {
        core.set_wall_clock(Instant::now(), shared::units::now_ms());
        if down_call.is_none()
            && let Some(call) = core.poll_down_call(Instant::now())
        {
            down_call = Some(Box::pin(make_down_call(sink, edge, call)));
        }
        tokio::select! {
            answer = async { down_call.as_mut().expect("checked").await }, if down_call.is_some() => {
                down_call = None;
                core.handle_down_answer(answer, Instant::now())?;
            }
            frame = control_rx.recv() => {
                let read = frame.map(|f| *f).transpose().map_err(SessionEnd::control)?.flatten();
                // The frame's memory is held until it is handled.
                let Some((frame, _held)) = read else { return Ok(()) };
                if let Err(e) = core.handle_control(frame, Instant::now()) {
                    return Err(Box::pin(ended(conn, &mut core, &mut send, e, metrics, &limits.log, edge)).await);
                }
            }
            Some(ingested) = batch_rx.recv(), if core.wants_batch() => {
                let Ingested { batch, records, reservation, frame_bytes } = (*ingested)?;
                metrics.batches.inc();
                metrics.bytes.inc_by(frame_bytes as u64);
                core.handle_batch(batch, records, reservation, Instant::now())?;
            }
            _ = sleep_until(core.poll_timeout().map(tokio::time::Instant::from_std)) => {
                core.handle_timeout(Instant::now())?;
            }
            // The fleet view's news that waited for its interval.
            _ = sleep_until(presence.due(core.session())) => {}
            _ = woken(&news), if news.is_some() => core.woken(),
            _ = model_poll.tick(), if edge_models.is_some() => {
                Box::pin(announce_models(edge, &mut edge_models, core.session_mut())).await;
            }
            written = writes.next() => {
                // This write and any others already done.
                let mut next = Some(written);
                while let Some(written) = next.take() {
                    writes.handle(written, &mut core, metrics, tracer)?;
                    next = writes.ready();
                }
                metrics.records.inc_by(core.take_published());
                // The next batches stage and publish while the marks are written.
                writes.start(&mut core, sink, edge, tracer);
                if let Some(marks) = core.poll_marks() {
                    let epoch = core.session().epoch().unwrap_or_default().to_owned();
                    for &(lane, up_to) in &marks {
                        Box::pin(sink.mark(edge, &epoch, lane, up_to)).await?;
                    }
                    core.handle_marked(&marks);
                }
            }
        }
        // The sink calls the core asks for, one at a time, and the events that answers (these
        // and the downlink's, above) made: drained before each call and after the last, so an
        // event the downlink's own lane made does not wait for a session call to come along
        // (the downlink's start did, and its news never woke the session: each message waited
        // for `downlink.poll`).
        loop {
            while let Some(event) = core.poll_event() {
                match event {
                    Event::Welcomed { epoch, version, committed, dicts: known, models: followed } => {
                        if let Some(held_back) = limits.log.allow() {
                            let committed =
                                committed.iter().map(|l| format!("{}:{}", l.lane, l.seq)).collect::<Vec<_>>().join(",");
                            tracing::info!(edge, epoch, version, committed, dicts = known, held_back, "edge hello");
                        }
                        presence.welcomed(core.session());
                        if let Some(service) = models.filter(|_| !followed.is_empty()) {
                            let m = EdgeModels::new(service.clone(), followed);
                            let server = AbortOnDropHandle::new(m.serve(conn.clone(), chunk_budget.clone()));
                            edge_models = Some((m, server));
                            Box::pin(announce_models(edge, &mut edge_models, core.session_mut())).await;
                        }
                    }
                    Event::Dict { id, bytes, stored } => {
                        if stored {
                            metrics.dicts_stored.inc();
                        }
                        dicts.add(id, bytes);
                    }
                    Event::DownStarted => news = Some(services.downlink.register(edge)),
                }
            }
            let Some(call) = core.poll_call() else { break };
            let answer = Box::pin(make_call(sink, edge, call)).await;
            if let Err(e) = core.handle_answer(answer) {
                return Err(Box::pin(ended(conn, &mut core, &mut send, e, metrics, &limits.log, edge)).await);
            }
        }
        writes.start(&mut core, sink, edge, tracer);
        let now_lag =
            core.session().lags().iter().fold(0u64, |sum, (_, l)| sum.saturating_add(*l)).min(i64::MAX as u64) as i64;
        metrics.lag.inc_by(now_lag - *lag);
        *lag = now_lag;
        presence.update(core.session());
        flush(core.session_mut(), &mut send).await?;
    }
}

/// Makes a sink call the core asked for.
async fn make_call<S: Sink>(sink: &S, edge: &str, call: Call) -> Result<Answer, SinkError> {
    Ok(match call {
        Call::AdmitEpoch { epoch } => Answer::Admitted(sink.admit_epoch(edge, &epoch).await?),
        Call::Committed { epoch } => {
            let lanes = sink.committed(edge, &epoch).await?;
            Answer::Committed { lanes, limits: sink.record_limits(edge, &epoch) }
        }
        Call::LoadDicts { ids } => Answer::Dicts(sink.load_dicts(edge, &ids).await?),
        Call::StoreDict(dict) => {
            sink.store_dict(edge, &dict).await?;
            Answer::DictStored
        }
        Call::StoreReport(report) => {
            let stored =
                crate::sink::StoredReport { edge: edge.to_owned(), received_ms: shared::units::now_ms(), report };
            sink.store_report(&stored).await?;
            Answer::ReportStored
        }
    })
}

/// A downlink call under way.
type DownFuture<'a> = std::pin::Pin<Box<dyn Future<Output = Result<DownAnswer, SinkError>> + Send + 'a>>;

/// Makes a downlink call the core asked for.
async fn make_down_call<S: Sink>(sink: &S, edge: &str, call: DownCall) -> Result<DownAnswer, SinkError> {
    Ok(match call {
        DownCall::State => DownAnswer::State(sink.down_state(edge).await?),
        DownCall::Record(done) => {
            sink.down_record(edge, &done).await?;
            DownAnswer::Recorded
        }
        DownCall::Read { after, max } => DownAnswer::Read(sink.down_read(edge, after, max).await?),
        DownCall::SetAside { seq, outcome, reason } => {
            sink.down_set_aside(edge, seq, outcome, &reason).await?;
            DownAnswer::SetAside
        }
    })
}

/// How the session ends for `error` from the core: a refusal or a protocol error is sent to the
/// edge first.
async fn ended(
    conn: &quinn::Connection,
    core: &mut SessionCore<Reservation>,
    send: &mut quinn::SendStream,
    error: CoreError,
    metrics: &Metrics,
    log: &crate::limits::LogBudget,
    edge: &str,
) -> SessionEnd {
    match error {
        CoreError::Refused { label, error } => {
            if let Some(label) = label {
                refuse(metrics, label);
                if let Some(held_back) = log.allow() {
                    tracing::warn!(edge, reason = label, held_back, "edge refused: {error}");
                }
            }
            refused(conn, core.session_mut(), send, error).await
        }
        other => other.into(),
    }
}

/// Resolves when news of the edge's downlink messages came.
async fn woken(news: &Option<Registration>) {
    match news {
        Some(r) => r.wake.notified().await,
        None => std::future::pending().await,
    }
}

/// Announces followed models' versions the edge has not heard of on this connection. A store
/// that cannot be read costs the edge a model update, not its telemetry session.
async fn announce_models(
    edge: &str,
    models: &mut Option<(EdgeModels, AbortOnDropHandle<()>)>,
    session: &mut CloudSession,
) {
    let Some((m, _)) = models else { return };
    match m.news().await {
        Ok(news) => {
            for a in news {
                tracing::info!(edge, model = a.name, version = a.version, "model announced");
                session.announce_model(a);
            }
        }
        Err(e) => tracing::warn!(edge, error = %e, "model store unreadable; models not announced"),
    }
}

/// Sends the refusal `error` queued in `session`, then gives the edge a moment to read it
/// before the connection closes (closing at once would discard the frame).
async fn refused(
    conn: &quinn::Connection,
    session: &mut CloudSession,
    send: &mut quinn::SendStream,
    error: shared::proto::edge::SessionError,
) -> SessionEnd {
    if let Err(e) = flush(session, send).await {
        return e.into();
    }
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.closed()).await;
    error.into()
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn flush(session: &mut CloudSession, send: &mut quinn::SendStream) -> Result<(), FrameIoError> {
    while let Some(frame) = session.poll_control() {
        write_frame(send, &frame).await?;
    }
    Ok(())
}
