//! The QUIC application close codes of an ehb/1 connection, named once for both ends: the
//! bridge closes with them, the edge reads them. A refusal (1 to 3) sends the edge to its
//! `backoff_max`; any other code is a failure it retries at its ordinary backoff.

/// The bridge shuts down, or the session ended for a reason of its own (the close's text says
/// which).
pub const DONE: u32 = 0;
/// The client certificate names no edge (or there is none).
pub const NO_IDENTITY: u32 = 1;
/// The certificate is on the deny list (at the handshake, or put there by a reload), or it
/// expired during the session.
pub const DENIED: u32 = 2;
/// A newer connection with this certificate replaced the session (two gateways sharing one
/// would otherwise take turns as fast as they can connect).
pub const REPLACED: u32 = 3;
/// The certificate starts sessions faster than its rate: the code of a replaced session, which
/// every edge version already waits out at its `backoff_max`.
pub const TOO_OFTEN: u32 = REPLACED;

/// Whether a connection closed with `code` was refused by the bridge.
pub fn is_refusal(code: u64) -> bool {
    [NO_IDENTITY, DENIED, REPLACED].iter().any(|c| u64::from(*c) == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusals_are_the_codes_one_to_three_as_every_edge_version_reads_them() {
        assert!((1..=3).all(is_refusal));
        assert!(!is_refusal(u64::from(DONE)) && !is_refusal(4));
    }
}
