//! What a NATS header may hold: names printable ASCII without `:`, values no CR or LF.

use std::borrow::Cow;

/// Header names hold printable ASCII without `:`; values no CR or LF. Anything else is
/// percent-encoded, reversibly; most are fine as they are, and are borrowed.
pub(super) fn header_safe(s: &str, name: bool) -> Cow<'_, str> {
    let bad = |c: char| c == '%' || c == '\r' || c == '\n' || (name && (c == ':' || !c.is_ascii_graphic()));
    if !s.contains(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `s` as a header value of at most `max` bytes (cut at a character).
pub(super) fn header_value(s: &str, max: usize) -> String {
    let safe = header_safe(s, false);
    let mut end = safe.len().min(max);
    while !safe.is_char_boundary(end) {
        end -= 1;
    }
    safe[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_made_safe() {
        assert_eq!(header_safe("trace id:x", true), "trace%20id%3Ax");
        assert_eq!(header_safe("line\r\nbreak 100%", false), "line%0D%0Abreak 100%25");
    }
}
