//! The uplink's policies without I/O or a clock, as `broker/core` is for the broker: fed what
//! happened with `now`, asked what to do next. The driver in `uplink/mod.rs` does the I/O
//! (QUIC, the spool, probes, timers); the fleet generator (`tests/src/simedge.rs`) drives the
//! same policies over a synthetic spool, so its figures are the product's.
//!
//! - [`Dialer`]: where and when to connect (the ring of bridges, backoff, probe answers).
//! - [`SendPolicy`]: what to read and send on a connection (heads, linger, fullness, lanes).
//! - [`Conn`]: one connection: control frames, store and spool commits and time passing into
//!   what the driver does ([`Io`]); downlink messages handed to the broker and acked once
//!   committed.
//!
//! The protocol's own state (window, acks, marks, pings, degradation) is
//! `shared::proto::edge::EdgeSession`, also sans-IO.

mod conn;
mod dial;
mod send;

pub use conn::{Conn, ConnError, Io};
pub use dial::{Attempt, Dialer, EndKind, Next, Servers};
pub use send::{Read, SendPolicy};

#[cfg(test)]
mod tests;
