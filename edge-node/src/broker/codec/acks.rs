//! The reason codes a PUBACK or a PUBREC carries (MQTT 5.0 §3.4.2.1, §3.5.2.1: the same list
//! for both), in one table read both ways: decoding a client's acknowledgement gives the code,
//! encoding ours gives rumqttd's reason. A code the table does not hold goes out as 0x80,
//! Unspecified error.

use rumqttd::protocol as rp;

use super::reason;

macro_rules! ack_reasons {
    ($($code:ident => $variant:ident),* $(,)?) => {
        /// The code of a PUBACK's reason.
        pub(super) fn puback_code(r: rp::PubAckReason) -> u8 {
            match r {
                $(rp::PubAckReason::$variant => reason::$code,)*
            }
        }

        /// The code of a PUBREC's reason.
        pub(super) fn pubrec_code(r: rp::PubRecReason) -> u8 {
            match r {
                $(rp::PubRecReason::$variant => reason::$code,)*
            }
        }

        /// The PUBACK reason of `code`.
        pub(super) fn puback_reason(code: u8) -> rp::PubAckReason {
            match code {
                $(reason::$code => rp::PubAckReason::$variant,)*
                _ => rp::PubAckReason::UnspecifiedError,
            }
        }

        /// The PUBREC reason of `code`.
        pub(super) fn pubrec_reason(code: u8) -> rp::PubRecReason {
            match code {
                $(reason::$code => rp::PubRecReason::$variant,)*
                _ => rp::PubRecReason::UnspecifiedError,
            }
        }
    };
}

ack_reasons! {
    SUCCESS => Success,
    NO_MATCHING_SUBSCRIBERS => NoMatchingSubscribers,
    UNSPECIFIED => UnspecifiedError,
    IMPLEMENTATION_SPECIFIC => ImplementationSpecificError,
    NOT_AUTHORIZED => NotAuthorized,
    TOPIC_NAME_INVALID => TopicNameInvalid,
    PACKET_ID_IN_USE => PacketIdentifierInUse,
    QUOTA_EXCEEDED => QuotaExceeded,
    PAYLOAD_FORMAT_INVALID => PayloadFormatInvalid,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_goes_both_ways_and_an_unknown_one_is_unspecified() {
        for code in [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99] {
            assert_eq!(puback_code(puback_reason(code)), code);
            assert_eq!(pubrec_code(pubrec_reason(code)), code);
        }
        assert_eq!(puback_code(puback_reason(0x8C)), 0x80);
        assert_eq!(pubrec_code(pubrec_reason(0x01)), 0x80);
    }
}
