//! One edge's downlink on its session: what the edge's connection task asks of it
//! between frames. [`CloudSession`] keeps the protocol's rules (order, window, acks); this reads
//! the sink when a read is due, feeds the session what fits, and records each ack in the sink
//! before the session says it is recorded.

use std::collections::VecDeque;
use std::sync::Arc;

use shared::proto::DOWNLINK_VERSION;
use shared::proto::cloud::CloudSession;
use shared::proto::down::{DownAck, MAX_DOWN_BYTES};
use shared::proto::edge::SessionError;
use shared::units::now_ms;

use super::{Downlink, Registration};
use crate::sink::downlink::{DownDone, Outgoing, Pending, done};
use crate::sink::{DownlinkStore, SinkError};

/// Why the downlink ended its session.
#[derive(Debug, thiserror::Error)]
pub enum DownError {
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// See the module doc.
#[derive(Debug)]
pub struct EdgeDown {
    downlink: Arc<Downlink>,
    registration: Registration,
    /// Read from the sink, not yet sent for want of room.
    ready: VecDeque<Pending>,
    /// Sent on this connection and not yet acked, in order, with their bytes.
    sent: VecDeque<(u64, u64)>,
    /// The position as of the last ack (or the start).
    acked: u64,
    /// The last read filled its request: read again without waiting for news.
    more: bool,
    /// No ack came on this connection yet: the first may name refusals an earlier bridge did
    /// not record.
    first_ack: bool,
    poll: tokio::time::Interval,
}

impl EdgeDown {
    /// Starts `edge`'s downlink on `session` if both ends speak it, after the sink's position or
    /// the edge's (`edge_mark`, from its hello), whichever is further; an edge further than the
    /// sink has its position recorded first (the bridge that sent those ended before it could).
    pub async fn start<S: DownlinkStore>(
        downlink: &Arc<Downlink>,
        sink: &S,
        edge: &str,
        session: &mut CloudSession,
        edge_mark: u64,
    ) -> Result<Option<Self>, SinkError> {
        if session.version() < DOWNLINK_VERSION {
            return Ok(None);
        }
        let state = sink.down_state(edge).await?;
        let position = if edge_mark > state.position {
            sink.down_record(edge, &DownDone { up_to: edge_mark, ..Default::default() }).await?;
            edge_mark
        } else {
            state.position
        };
        if !session.start_down(position) {
            return Ok(None);
        }
        let mut poll = tokio::time::interval(downlink.config.poll.0);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Some(Self {
            registration: downlink.register(edge),
            downlink: downlink.clone(),
            ready: VecDeque::new(),
            sent: VecDeque::new(),
            acked: position,
            more: false,
            first_ack: true,
            poll,
        }))
    }

    /// Resolves when a read is due: what was read waits, the last read was full, news came, or
    /// the poll. Awaited only while the session has room.
    pub async fn due(&mut self) {
        if self.more || !self.ready.is_empty() {
            return;
        }
        tokio::select! {
            _ = self.registration.wake.notified() => {}
            _ = self.poll.tick() => {}
        }
    }

    /// Reads the edge's next messages if none wait, and sends what fits.
    pub async fn read<S: DownlinkStore>(
        &mut self,
        sink: &S,
        edge: &str,
        session: &mut CloudSession,
    ) -> Result<(), DownError> {
        if self.ready.is_empty() {
            let want = self.downlink.config.window_messages;
            let read = sink.down_read(edge, session.down_sent(), want).await?;
            self.more = read.len() >= want;
            self.ready.extend(read);
        }
        self.feed(sink, edge, session).await
    }

    /// Sends what was read while the window has room. A message the sink could not make sense
    /// of is set aside with its reason and sent empty, expiring at once, so the edge's position
    /// passes it.
    pub async fn feed<S: DownlinkStore>(
        &mut self,
        sink: &S,
        edge: &str,
        session: &mut CloudSession,
    ) -> Result<(), DownError> {
        let now = now_ms();
        while session.down_room() {
            let Some(p) = self.ready.pop_front() else { break };
            let bytes = p.msg.bytes();
            let too_large = (p.msg.bytes() > MAX_DOWN_BYTES as u64)
                .then(|| format!("{} bytes, more than a downlink message may hold ({MAX_DOWN_BYTES})", p.msg.bytes()));
            let down = match p.invalid.as_ref().or(too_large.as_ref()) {
                Some(reason) => {
                    tracing::warn!(edge, seq = p.seq, reason, "downlink message set aside: it does not parse");
                    sink.down_set_aside(edge, p.seq, "invalid", reason).await?;
                    self.downlink.metrics.invalid.inc();
                    Outgoing { expires_at_ms: Some(0), ..p.msg }.to_down(p.seq, now)
                }
                None => p.msg.to_down(p.seq, now),
            };
            session.send_down(down)?;
            self.sent.push_back((p.seq, bytes));
            self.downlink.metrics.sent.inc();
        }
        Ok(())
    }

    /// The edge's ack: its refusals and position recorded in the sink, then the session tells
    /// the edge so, and what the window freed is filled.
    pub async fn acked<S: DownlinkStore>(
        &mut self,
        sink: &S,
        edge: &str,
        session: &mut CloudSession,
        ack: DownAck,
    ) -> Result<(), DownError> {
        let (mut count, mut bytes) = (0, 0);
        while let Some((_, b)) = self.sent.front().copied().filter(|(seq, _)| *seq <= ack.up_to) {
            self.sent.pop_front();
            count += 1;
            bytes += b;
        }
        let up_to = ack.up_to;
        let catch_up = std::mem::replace(&mut self.first_ack, false);
        if let Some(done) = done(self.acked, (count, bytes), up_to, (ack.refused, ack.expired), catch_up) {
            for r in done.refused.iter().filter(|r| r.seq > self.acked) {
                tracing::info!(edge, seq = r.seq, reason = r.reason, "downlink message refused by the edge");
            }
            sink.down_record(edge, &done).await?;
            let m = &self.downlink.metrics;
            m.count("delivered", done.counts.delivered);
            m.count("refused", done.counts.refused);
            m.count("expired", done.counts.expired);
        }
        self.acked = up_to;
        session.down_marked(up_to);
        self.feed(sink, edge, session).await
    }
}
