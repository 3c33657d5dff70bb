//! One connection of the uplink, without I/O or a clock: what a control frame, a store commit, a
//! spool commit or time passing means for the session, the send policy and the downlink, and
//! what the driver must do about it ([`Io`]). The driver in `uplink/mod.rs` reads the QUIC
//! streams and the spool and carries the `Io` out; the simulation does the same over its own
//! link and spool.
//!
//! Per connection it keeps the [`SendPolicy`]; the protocol state ([`EdgeSession`]) and the
//! downlink ([`DownCore`]: its rules, the messages handed to the broker and not yet committed,
//! the committed mark) outlive it and are lent to each call. A downlink message is answered in
//! order once the store committed it, on whichever connection is up by then.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use shared::proto::edge::{EdgeEvent, EdgeSession, SessionError};
use shared::proto::{Control, ModelAnnounce, SinkLimits};

use super::send::{Read, SendPolicy};
use crate::downlink::{DownCore, Target};

/// What the driver must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Io {
    /// Write this frame on the control stream.
    Control(Control),
    /// The Welcome says the cloud committed `lane` through `committed`: check that against the
    /// spool before it counts as an ack (its disk may have gone back in time).
    CheckMark { lane: u8, committed: u64 },
    /// The cloud committed `lane` through `up_to`: delete those records from the spool.
    Ack { lane: u8, up_to: u64 },
    /// The session is ready, in `version`: every mark was checked (tell the spool), the cloud
    /// holds `dicts` and its sink stores records within `sink`; read the heads
    /// ([`Conn::set_heads`]) and send.
    Ready { version: u16, dicts: Vec<String>, sink: Option<SinkLimits> },
    /// The cloud stored a dictionary this edge announced.
    DictStored(String),
    /// The cloud announced a model version (unverified).
    Model(ModelAnnounce),
    /// A batch was acked this long after it was sent.
    Committed(Duration),
    /// A ping's round trip.
    Rtt(Duration),
    /// The link became degraded (connected, no acks) or recovered.
    Degraded(bool),
}

/// Why the connection must end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// See the module doc.
#[derive(Debug)]
pub struct Conn {
    policy: SendPolicy,
    io: VecDeque<Io>,
}

impl Conn {
    /// A connection is up: the session starts from the downlink's committed mark (the store
    /// committed every op through `stored`, connected or not) and says hello.
    pub fn start(
        session: &mut EdgeSession,
        down: &mut DownCore,
        stored: u64,
        policy: SendPolicy,
        now: Instant,
    ) -> Self {
        down.stored(stored);
        let mark = down.mark();
        session.catch_up_down(mark.done, mark.refusals(), mark.expired.clone());
        session.connected(now);
        Self { policy, io: VecDeque::new() }
    }

    /// A control frame from the bridge. Downlink messages are handed to the broker here;
    /// everything else becomes [`Io`].
    pub fn handle_control(
        &mut self,
        session: &mut EdgeSession,
        down: &mut DownCore,
        target: &mut dyn Target,
        frame: Control,
        now: Instant,
    ) -> Result<(), ConnError> {
        let events = session.handle(frame, now)?;
        for event in events {
            let io = match event {
                EdgeEvent::Mark { lane, committed } => Io::CheckMark { lane, committed },
                EdgeEvent::Acked { lane, up_to } => Io::Ack { lane, up_to },
                EdgeEvent::Ready { version, dicts, sink } => Io::Ready { version, dicts, sink },
                EdgeEvent::DictStored(id) => Io::DictStored(id),
                EdgeEvent::Model(announce) => Io::Model(announce),
                EdgeEvent::Committed { latency, .. } => Io::Committed(latency),
                EdgeEvent::Rtt(rtt) => Io::Rtt(rtt),
                EdgeEvent::Degraded(d) => Io::Degraded(d),
                // Acked once the store committed it ([`Conn::handle_stored`]), while the next
                // ones come in: a window of them shares the store's commits.
                EdgeEvent::Down(d) => {
                    down.offer(target, &d, now);
                    continue;
                }
                EdgeEvent::DownMarked(up_to) => {
                    down.marked(up_to);
                    continue;
                }
            };
            self.io.push_back(io);
        }
        Self::answer(session, down)
    }

    /// The session store committed every op through `through`: the downlink messages it holds
    /// are done, and their acks go with the next control frames.
    pub fn handle_stored(
        &mut self,
        session: &mut EdgeSession,
        down: &mut DownCore,
        through: u64,
    ) -> Result<(), ConnError> {
        down.stored(through);
        Self::answer(session, down)
    }

    /// Answers the session's downlink messages, oldest first, as far as the store committed
    /// them.
    fn answer(session: &mut EdgeSession, down: &DownCore) -> Result<(), ConnError> {
        while let Some(seq) = session.down_oldest_pending() {
            let Some(outcome) = down.outcome(seq) else { break };
            session.down_done(seq, outcome)?;
        }
        Ok(())
    }

    /// The spool committed these lanes through these seqs, learnt at `now`.
    pub fn set_heads(&mut self, session: &mut EdgeSession, heads: impl IntoIterator<Item = (u8, u64)>, now: Instant) {
        for (lane, last) in heads {
            self.policy.set_head(lane, last, now);
            session.set_head(lane, last);
        }
    }

    /// When [`Conn::handle_timeout`] has work: a ping, a late ack, a lingering lane.
    pub fn poll_timeout(&self, session: &EdgeSession) -> Option<Instant> {
        [session.poll_timeout(), self.policy.poll_timeout()].into_iter().flatten().min()
    }

    /// Time passed: pings, the degraded state.
    pub fn handle_timeout(&mut self, session: &mut EdgeSession, now: Instant) -> Result<(), ConnError> {
        if session.poll_timeout().is_some_and(|t| now >= t) {
            for event in session.handle_timeout(now) {
                if let EdgeEvent::Degraded(d) = event {
                    self.io.push_back(Io::Degraded(d));
                }
            }
        }
        Ok(())
    }

    /// Starts a send pass: the reads [`Conn::poll_read`] asks for until it says none go
    /// together.
    pub fn begin_pass(&mut self) {
        self.policy.begin();
    }

    /// The next read of this pass (see [`SendPolicy::next`]).
    pub fn poll_read(&mut self, session: &EdgeSession, now: Instant) -> Option<Read> {
        self.policy.poll_read(session, now)
    }

    /// The spool had nothing of `lane` after `after`.
    pub fn handle_empty_read(&mut self, lane: u8, after: u64) {
        self.policy.handle_empty_read(lane, after);
    }

    /// Whether a batch of `records` is full (a stream of its own).
    pub(crate) fn is_full(&self, records: usize) -> bool {
        self.policy.is_full(records)
    }

    /// A batch of `lane` with seqs `first..=last` was sent.
    pub fn handle_sent(
        &mut self,
        session: &mut EdgeSession,
        lane: u8,
        first: u64,
        last: u64,
        now: Instant,
    ) -> Result<(), ConnError> {
        Ok(session.sent(lane, first, last, now)?)
    }

    /// The next thing to do: what the last inputs asked for, then the control frames to write.
    pub fn poll_io(&mut self, session: &mut EdgeSession) -> Option<Io> {
        self.io.pop_front().or_else(|| session.poll_control().map(Io::Control))
    }
}
