//! Compact JSON taken apart into a shape and its scalar values, and numbers put back as text:
//! the part of a column-wise body that must give back a payload byte for byte.

/// The byte standing for a value in a shape: never in JSON text outside an escape.
pub(super) const SLOT: u8 = 0;
const MAX_DEPTH: usize = 32;
/// Digits of a number kept as an integer (below 2^63).
const MAX_DIGITS: usize = 18;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Val<'a> {
    Num { mantissa: i64, scale: u8 },
    Str(&'a [u8]),
    True,
    False,
    Null,
}

/// A compact JSON object or array: its shape and its scalar values in order; none if putting
/// them back would not give exactly `p`.
pub(super) fn cut(p: &[u8]) -> Option<(Vec<u8>, Vec<Val<'_>>)> {
    if !matches!(p.first(), Some(b'{' | b'[')) {
        return None;
    }
    let mut c = Cut { p, i: 0, shape: Vec::with_capacity(p.len() / 2), vals: Vec::new() };
    c.value(0)?;
    (c.i == p.len()).then_some((c.shape, c.vals))
}

struct Cut<'a> {
    p: &'a [u8],
    i: usize,
    shape: Vec<u8>,
    vals: Vec<Val<'a>>,
}

impl<'a> Cut<'a> {
    fn peek(&self) -> Option<u8> {
        self.p.get(self.i).copied()
    }

    fn keep(&mut self, b: u8) -> Option<()> {
        (self.peek()? == b).then(|| {
            self.shape.push(b);
            self.i += 1;
        })
    }

    /// A string at `i`: the bytes between its quotes, escapes as they are.
    fn string(&mut self) -> Option<&'a [u8]> {
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.i + 1;
        let mut j = start;
        loop {
            match *self.p.get(j)? {
                b'"' => break,
                b'\\' => j += 2,
                b if b < 0x20 => return None,
                _ => j += 1,
            }
        }
        self.i = j + 1;
        Some(&self.p[start..j])
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' => {
                self.keep(b'{')?;
                if self.keep(b'}').is_some() {
                    return Some(());
                }
                loop {
                    let key = self.string()?;
                    self.shape.push(b'"');
                    self.shape.extend_from_slice(key);
                    self.shape.push(b'"');
                    self.keep(b':')?;
                    self.value(depth + 1)?;
                    if self.keep(b',').is_none() {
                        return self.keep(b'}');
                    }
                }
            }
            b'[' => {
                self.keep(b'[')?;
                if self.keep(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.value(depth + 1)?;
                    if self.keep(b',').is_none() {
                        return self.keep(b']');
                    }
                }
            }
            b'"' => {
                let s = self.string()?;
                self.slot(Val::Str(s))
            }
            b't' => self.word(b"true", Val::True),
            b'f' => self.word(b"false", Val::False),
            b'n' => self.word(b"null", Val::Null),
            _ => self.number(),
        }
    }

    fn word(&mut self, w: &[u8], v: Val<'a>) -> Option<()> {
        self.p.get(self.i..self.i + w.len()).filter(|s| *s == w)?;
        self.i += w.len();
        self.slot(v)
    }

    fn slot(&mut self, v: Val<'a>) -> Option<()> {
        self.shape.push(SLOT);
        self.vals.push(v);
        Some(())
    }

    fn number(&mut self) -> Option<()> {
        let neg = self.peek()? == b'-';
        if neg {
            self.i += 1;
        }
        let digits = |c: &Self, from: usize| c.p[from..].iter().take_while(|b| b.is_ascii_digit()).count();
        let int = digits(self, self.i);
        // JSON: one digit at least, no leading zero; and few enough to add up in an i64.
        if int == 0 || (int > 1 && self.p[self.i] == b'0') || int > MAX_DIGITS {
            return None;
        }
        let mut m: i64 = 0;
        for &b in &self.p[self.i..self.i + int] {
            m = m * 10 + i64::from(b - b'0');
        }
        self.i += int;
        let mut scale = 0;
        if self.peek() == Some(b'.') {
            let frac = digits(self, self.i + 1);
            if frac == 0 || int + frac > MAX_DIGITS {
                return None;
            }
            for &b in &self.p[self.i + 1..self.i + 1 + frac] {
                m = m * 10 + i64::from(b - b'0');
            }
            self.i += 1 + frac;
            scale = frac as u8;
        }
        if int + usize::from(scale) > MAX_DIGITS || matches!(self.peek(), Some(b'e' | b'E')) || (neg && m == 0) {
            return None;
        }
        self.slot(Val::Num { mantissa: if neg { -m } else { m }, scale })
    }
}

/// The mantissa and scale of `text`, a whole JSON number that [`render`] gives back as it is.
#[cfg_attr(not(feature = "schema"), allow(dead_code))]
pub(super) fn decimal(text: &[u8]) -> Option<(i64, u8)> {
    let mut c = Cut { p: text, i: 0, shape: Vec::new(), vals: Vec::new() };
    c.number()?;
    match c.vals.pop() {
        Some(Val::Num { mantissa, scale }) if c.i == text.len() => Some((mantissa, scale)),
        _ => None,
    }
}

/// A value as JSON text.
pub(super) fn put(v: &Val<'_>, out: &mut Vec<u8>) -> Option<()> {
    match v {
        Val::Num { mantissa, scale } => render(*mantissa, *scale, out)?,
        Val::Str(s) => {
            out.push(b'"');
            out.extend_from_slice(s);
            out.push(b'"');
        }
        Val::True => out.extend_from_slice(b"true"),
        Val::False => out.extend_from_slice(b"false"),
        Val::Null => out.extend_from_slice(b"null"),
    }
    Some(())
}

/// A number as its text: sign, integer digits, and `scale` fraction digits.
pub(super) fn render(mantissa: i64, scale: u8, out: &mut Vec<u8>) -> Option<()> {
    if usize::from(scale) > MAX_DIGITS {
        return None;
    }
    if mantissa < 0 {
        out.push(b'-');
    }
    let abs = mantissa.unsigned_abs();
    let pow = 10u64.pow(u32::from(scale));
    out.extend_from_slice((abs / pow).to_string().as_bytes());
    if scale > 0 {
        out.push(b'.');
        out.extend_from_slice(format!("{:0width$}", abs % pow, width = usize::from(scale)).as_bytes());
    }
    Some(())
}
