//! Reading a Rust file for the layout rules: its code without comments, string and character
//! literals (a path in a doc comment or a test's literal imports nothing), and the paths in it.

pub(super) fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first segment of every path that follows `crate::` in `text`, groups expanded.
pub(super) fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        // `edge_node::crate::` does not occur; `foo_crate::x` would be another crate's path.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(is_ident) {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // The group's top-level items, up to its closing brace.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(first_segment(&item));
        } else if !rest.trim_start().trim_start_matches(is_ident).starts_with('!') {
            // `crate::name!` is a macro the crate exports at its root, not a module's item.
            out.push(first_segment(rest));
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Every whole path that follows `crate::` in `text`, groups expanded: `crate::a::{b, c::D}`
/// is `a::b` and `a::c::D`.
pub(super) fn crate_items(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if !before.is_some_and(is_ident) {
            expand("", rest, &mut out);
        }
    }
    out
}

/// Expands the path at the start of `text` after `prefix` into `out`; returns what it read.
pub(super) fn expand(prefix: &str, text: &str, out: &mut Vec<String>) -> usize {
    let mut path = prefix.to_owned();
    let mut i = 0;
    let bytes = text.as_bytes();
    loop {
        let ident: String = text[i..].chars().take_while(|c| is_ident(*c)).collect();
        i += ident.len();
        path.push_str(&ident);
        if text[i..].starts_with("::{") {
            path.push_str("::");
            i += 3;
            loop {
                while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\n' || bytes[i] == b',') {
                    i += 1;
                }
                if i >= bytes.len() || bytes[i] == b'}' {
                    return i + 1;
                }
                i += expand(&path, &text[i..], out);
            }
        }
        if text[i..].starts_with("::") && text[i + 2..].starts_with(|c: char| is_ident(c) || c == '{') {
            path.push_str("::");
            i += 2;
            continue;
        }
        out.push(path);
        return i;
    }
}

/// `text` without its unit tests (`#[cfg(test)] mod tests { ... }` ends a file by convention
/// here): a test may build another subsystem's section to drive its own.
pub(super) fn without_tests(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests").map_or(text, |at| &text[..at])
}

fn first_segment(path: &str) -> String {
    path.trim_start().chars().take_while(|c| is_ident(*c)).collect()
}

/// `text` with comments (doc comments too), string literals and character literals blanked,
/// lines kept: what is left is code, so a `crate::` in a doc link or a test's string is not an
/// import.
pub(super) fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(b, i) {
            // r"..." or r#"..."#: no escapes; ends at the quote and as many hashes.
            let open = 1 + hashes + 1 + usize::from(b[i] == b'b');
            out.extend(std::iter::repeat_n(b' ', open));
            i += open;
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            while i < b.len() && !b[i..].starts_with(&close) {
                blank(&mut out, b[i]);
                i += 1;
            }
            let n = close.len().min(b.len() - i);
            out.extend(std::iter::repeat_n(b' ', n));
            i += n;
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                blank(&mut out, b[i]);
                i += 1;
            }
            if i < b.len() {
                out.push(b' ');
                i += 1;
            }
        } else if b[i] == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime, which stays.
            match char_literal_len(&b[i..]) {
                0 => out.push(b'\''),
                len => {
                    out.extend(std::iter::repeat_n(b' ', len));
                    i += len - 1;
                }
            }
            i += 1;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The hashes of a raw string literal starting at `i` (`r"`, `r#"`, `br"`), if one does.
fn raw_string_start(b: &[u8], i: usize) -> Option<usize> {
    let start = if b[i..].starts_with(b"br") {
        i + 2
    } else if b[i] == b'r' {
        i + 1
    } else {
        return None;
    };
    if i > 0 && is_ident(b[i - 1] as char) {
        return None;
    }
    let hashes = b[start..].iter().take_while(|c| **c == b'#').count();
    (b.get(start + hashes) == Some(&b'"')).then_some(hashes)
}

/// The length of the character literal `b` starts with, or 0 for a lifetime or label.
fn char_literal_len(b: &[u8]) -> usize {
    if b.len() >= 4 && b[1] == b'\\' {
        // '\n', '\\', '\'', '\u{1F600}'
        if b[2] == b'\'' {
            return 4;
        }
        return b[2..].iter().position(|c| *c == b'\'').map_or(0, |p| p + 3);
    }
    // One character, of up to four bytes, then the closing quote.
    let width = match b.get(1) {
        Some(c) if *c < 0x80 => 1,
        Some(c) if *c >= 0xF0 => 4,
        Some(c) if *c >= 0xE0 => 3,
        Some(_) => 2,
        None => return 0,
    };
    if b.get(1 + width) == Some(&b'\'') { width + 2 } else { 0 }
}
