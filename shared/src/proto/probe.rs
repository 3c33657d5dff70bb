//! A reachability probe for a bridge, without I/O: one datagram a QUIC server answers with no
//! state and no TLS work, so an edge whose link is down can ask every couple of seconds whether
//! the bridge is back, and start the full handshake only once it is.
//!
//! The probe is a QUIC long-header packet of a version no one speaks (RFC 9000 §15 reserves
//! every version of the form `0x?a?a?a?a` for this), padded to 1,200 bytes. A server MUST
//! answer such a packet of that size with a Version Negotiation packet (RFC 9000 §6.1, §5.2.2)
//! echoing the connection ids: the answer is smaller than the probe, so probes cannot be used
//! to amplify, and quinn sends it from its endpoint before any connection exists (no `Incoming`,
//! no admission token spent, no handshake work).

/// The size a server requires before it answers an unknown version (RFC 9000 §14.1).
pub(crate) const PROBE_BYTES: usize = 1200;

/// A reserved version (RFC 9000 §15): never negotiated, always answered.
const PROBE_VERSION: u32 = 0x1a2a_3a4a;

/// The probe datagram carrying `id` as both connection ids; the answer echoes it.
pub fn datagram(id: [u8; 8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(PROBE_BYTES);
    // Long header, fixed bit set; the type bits mean nothing under an unknown version.
    d.push(0xc0);
    d.extend_from_slice(&PROBE_VERSION.to_be_bytes());
    d.push(id.len() as u8);
    d.extend_from_slice(&id);
    d.push(id.len() as u8);
    d.extend_from_slice(&id);
    d.resize(PROBE_BYTES, 0);
    d
}

/// Whether `datagram` is a Version Negotiation packet answering the probe carrying `id`: a long
/// header, version 0, both connection ids ours.
pub fn answers(datagram: &[u8], id: [u8; 8]) -> bool {
    let n = id.len();
    if datagram.len() < 7 + 2 * n || datagram[0] & 0x80 == 0 || datagram[1..5] != [0, 0, 0, 0] {
        return false;
    }
    let dcid = &datagram[5..];
    if usize::from(dcid[0]) != n || dcid[1..=n] != id {
        return false;
    }
    let scid = &dcid[1 + n..];
    usize::from(scid[0]) == n && scid[1..=n] == id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_is_a_padded_long_header_of_a_reserved_version() {
        let d = datagram([7; 8]);
        assert_eq!(d.len(), PROBE_BYTES);
        assert_eq!(d[0] & 0xc0, 0xc0);
        let version = u32::from_be_bytes(d[1..5].try_into().unwrap());
        assert_eq!(version & 0x0f0f_0f0f, 0x0a0a_0a0a, "RFC 9000 §15: reserved versions are 0x?a?a?a?a");
    }

    #[test]
    fn only_a_version_negotiation_echoing_our_ids_answers() {
        let id = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut vn = vec![0x80 | 0x2a, 0, 0, 0, 0, 8];
        vn.extend_from_slice(&id);
        vn.push(8);
        vn.extend_from_slice(&id);
        vn.extend_from_slice(&1u32.to_be_bytes());
        assert!(answers(&vn, id));
        assert!(!answers(&vn, [9; 8]), "someone else's probe");
        let mut versioned = vn.clone();
        versioned[4] = 1;
        assert!(!answers(&versioned, id), "not a version negotiation");
        assert!(!answers(&vn[..10], id), "truncated");
        assert!(!answers(&[], id));
    }
}
