//! The property rules of an MQTT 5 CONNECT that rumqttd's decoder does not keep: it takes the
//! last of a property given twice, where §2.2.2.2 makes that a Protocol Error (a property other
//! than User Property appears at most once; §3.1.2.11 and §3.1.3.2 for each of CONNECT's and
//! the will's), and it reads a Response Topic with wildcards, which [MQTT-3.3.2-14] forbids for
//! the will's as for a PUBLISH's.

use super::{DecodeError, read_u16, read_varint};

/// How long a property's value is, by its identifier (§2.2.2.2).
enum Kind {
    Byte,
    U16,
    U32,
    Varint,
    /// A UTF-8 string or binary data: a two-byte length, then that many bytes.
    Bytes,
    Pair,
}

fn kind(id: u8) -> Option<Kind> {
    Some(match id {
        0x01 | 0x17 | 0x19 | 0x24 | 0x25 | 0x28 | 0x29 | 0x2A => Kind::Byte,
        0x13 | 0x21 | 0x22 | 0x23 => Kind::U16,
        0x02 | 0x11 | 0x18 | 0x27 => Kind::U32,
        0x0B => Kind::Varint,
        0x03 | 0x08 | 0x09 | 0x12 | 0x15 | 0x16 | 0x1A | 0x1C | 0x1F => Kind::Bytes,
        0x26 => Kind::Pair,
        _ => return None,
    })
}

const RESPONSE_TOPIC: u8 = 0x08;
const USER_PROPERTY: u8 = 0x26;

/// Checks one property section: each property other than User Property at most once, and a
/// Response Topic without wildcards. `what` names the section in the error.
fn check_section(props: &[u8], what: &'static str) -> Result<(), DecodeError> {
    const SHORT: DecodeError = DecodeError::Malformed("a property shorter than its value");
    let mut seen = [false; 256];
    let mut i = 0;
    while i < props.len() {
        let id = props[i];
        i += 1;
        if id != USER_PROPERTY && std::mem::replace(&mut seen[usize::from(id)], true) {
            return Err(DecodeError::Protocol(what));
        }
        let len = match kind(id).ok_or(DecodeError::Malformed("an unknown property"))? {
            Kind::Byte => 1,
            Kind::U16 => 2,
            Kind::U32 => 4,
            Kind::Varint => read_varint(props.get(i..).ok_or(SHORT)?).ok_or(SHORT)?.1,
            Kind::Bytes => 2 + usize::from(read_u16(props, i).ok_or(SHORT)?),
            Kind::Pair => {
                let first = 2 + usize::from(read_u16(props, i).ok_or(SHORT)?);
                first + 2 + usize::from(read_u16(props, i + first).ok_or(SHORT)?)
            }
        };
        let value = props.get(i..i + len).ok_or(SHORT)?;
        if id == RESPONSE_TOPIC && value[2..].iter().any(|b| matches!(b, b'+' | b'#')) {
            return Err(DecodeError::Protocol("a Response Topic with a wildcard"));
        }
        i += len;
    }
    Ok(())
}

/// Checks an MQTT 5 CONNECT's property sections, its own and its will's. `body` is the frame
/// after the fixed header, `name_len` the protocol name's length, `flags` the connect flags.
pub(super) fn check_connect(body: &[u8], name_len: usize, flags: u8) -> Result<(), DecodeError> {
    const SHORT: DecodeError = DecodeError::Malformed("CONNECT shorter than its properties");
    // Protocol name, level, flags, keep alive.
    let at = 2 + name_len + 1 + 1 + 2;
    let (len, n) = read_varint(body.get(at..).ok_or(SHORT)?).ok_or(SHORT)?;
    check_section(body.get(at + n..at + n + len).ok_or(SHORT)?, "a CONNECT property given twice")?;
    if flags & 0x04 == 0 {
        return Ok(());
    }
    // The payload: the client id, then the will's properties.
    let id_at = at + n + len;
    let will_at = id_at + 2 + usize::from(read_u16(body, id_at).ok_or(SHORT)?);
    let (len, n) = read_varint(body.get(will_at..).ok_or(SHORT)?).ok_or(SHORT)?;
    check_section(body.get(will_at + n..will_at + n + len).ok_or(SHORT)?, "a will property given twice")
}
