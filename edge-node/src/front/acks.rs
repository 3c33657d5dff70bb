//! The order in which a client gets its QoS1 PUBACKs back.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// The QoS1 PUBACKs a client is owed, in the order its publishes arrived. The broker answers the
/// publishes it was given, the front the others (refused, spooled for the cloud only); MQTT 3.1.1
/// (section 4.6) wants them back in publish order, so each waits for those before it.
#[derive(Debug, Default)]
pub(super) struct AckOrder {
    queue: VecDeque<(u16, Option<Bytes>)>,
}

impl AckOrder {
    /// A publish went to the broker; its PUBACK will come from there.
    pub(super) fn expect(&mut self, pkid: u16) {
        self.queue.push_back((pkid, None));
    }

    /// A PUBACK is ready: fills the oldest slot waiting for `pkid`, or queues it at the end.
    pub(super) fn ready(&mut self, pkid: u16, frame: Bytes) {
        match self.queue.iter_mut().find(|(p, f)| *p == pkid && f.is_none()) {
            Some(slot) => slot.1 = Some(frame),
            None => self.queue.push_back((pkid, Some(frame))),
        }
    }

    /// The PUBACKs that may go now, in order.
    pub(super) fn drain(&mut self, out: &mut BytesMut) {
        while let Some((_, Some(_))) = self.queue.front() {
            if let Some((_, Some(frame))) = self.queue.pop_front() {
                out.extend_from_slice(&frame);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_acks_wait_for_earlier_ones() {
        let mut order = AckOrder::default();
        order.expect(1);
        order.ready(2, Bytes::from_static(b"B"));
        let mut out = BytesMut::new();
        order.drain(&mut out);
        assert!(out.is_empty(), "2 must wait for 1");
        order.ready(1, Bytes::from_static(b"A"));
        order.drain(&mut out);
        assert_eq!(&out[..], b"AB");
    }
}
