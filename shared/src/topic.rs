//! MQTT topic names and filters: validation, matching, and whether one filter covers another.
//!
//! Matching follows MQTT 3.1.1 section 4.7: `+` is one level, a trailing `#` is this level and
//! everything below (including the parent itself), and a filter that starts with a wildcard does
//! not match topics that start with `$`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a string is not a valid topic name or filter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    #[error("topic filter is empty")]
    Empty,
    #[error("topic filter {0:?}: '#' must be the last level, alone")]
    MisplacedMultiLevel(String),
    #[error("topic filter {0:?}: '+' must fill a whole level")]
    MisplacedSingleLevel(String),
    #[error("topic name {0:?} contains a wildcard")]
    WildcardInName(String),
    #[error("topic {0:?} contains a NUL character")]
    Nul(String),
}

/// Checks a topic name (what a PUBLISH carries).
pub fn validate_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::Empty);
    }
    if name.contains('\0') {
        return Err(TopicError::Nul(name.to_owned()));
    }
    if name.contains(['+', '#']) {
        return Err(TopicError::WildcardInName(name.to_owned()));
    }
    Ok(())
}

/// A validated MQTT topic filter.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicFilter(String);

impl TopicFilter {
    pub fn new(filter: impl Into<String>) -> Result<Self, TopicError> {
        let filter = filter.into();
        validate_filter(&filter)?;
        Ok(Self(filter))
    }

    /// Does this filter match the topic name `topic`?
    pub fn matches(&self, topic: &str) -> bool {
        matches(&self.0, topic)
    }

    /// Does every topic that `other` matches also match `self`?
    pub fn covers(&self, other: &str) -> bool {
        covers(&self.0, other)
    }
}

impl fmt::Debug for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TopicFilter {
    type Err = TopicError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl<'de> Deserialize<'de> for TopicFilter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

impl Serialize for TopicFilter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Checks a topic filter (what a SUBSCRIBE carries).
pub fn validate_filter(filter: &str) -> Result<(), TopicError> {
    if filter.is_empty() {
        return Err(TopicError::Empty);
    }
    if filter.contains('\0') {
        return Err(TopicError::Nul(filter.to_owned()));
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        if level.contains('#') && (level != "#" || !last) {
            return Err(TopicError::MisplacedMultiLevel(filter.to_owned()));
        }
        if level.contains('+') && level != "+" {
            return Err(TopicError::MisplacedSingleLevel(filter.to_owned()));
        }
    }
    Ok(())
}

/// Does `filter` match the topic name `topic`? Both are assumed valid.
///
/// Level by level over the bytes: the broker asks this several times per message (classes,
/// reserved topics, the ACL), and `str::split`'s searcher was 3 % of the local path's
/// instructions. The tests hold it to the `split` reading it replaced.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    // What is left of each after the levels compared; `None` once its last level was.
    let (mut f, mut t) = (Some(filter.as_bytes()), Some(topic.as_bytes()));
    loop {
        match (f.map(first_level), t.map(first_level)) {
            (Some((b"#", _)), _) => return true,
            (Some((b"+", f_rest)), Some((_, t_rest))) => (f, t) = (f_rest, t_rest),
            (Some((fl, f_rest)), Some((tl, t_rest))) if fl == tl => (f, t) = (f_rest, t_rest),
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The first level of `s` and the rest after its `/`, if it has one.
fn first_level(s: &[u8]) -> (&[u8], Option<&[u8]>) {
    match s.iter().position(|&b| b == b'/') {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

/// Does filter `outer` match every topic that filter `inner` matches? Both are assumed valid.
/// Used to decide whether a subscription lies inside what an ACL allows.
pub(crate) fn covers(outer: &str, inner: &str) -> bool {
    // A leading wildcard never matches `$` topics, so it cannot cover a filter for them.
    if inner.starts_with('$') && outer.starts_with(['+', '#']) {
        return false;
    }
    let mut o = outer.split('/');
    let mut i = inner.split('/');
    loop {
        match (o.next(), i.next()) {
            // Also when `inner` ran out: `a/#` matches `a`, so it covers `inner = a`.
            (Some("#"), _) => return true,
            // `inner` matches deeper topics than `outer` can.
            (Some(_), Some("#")) => return false,
            (Some("+"), Some(_)) => {}
            (Some(ol), Some(il)) if ol == il => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_filters() {
        for ok in ["a", "a/b", "+", "#", "a/+/c", "a/#", "+/+/#", "/", "$SYS/#"] {
            assert!(validate_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a/b+", "++", "#/a", "a\0b"] {
            assert!(validate_filter(bad).is_err(), "{bad}");
        }
        assert!(validate_name("a/b").is_ok());
        assert!(validate_name("a/+").is_err());
        assert!(validate_name("").is_err());
    }

    #[test]
    fn matches_per_spec() {
        let cases = [
            ("a/b", "a/b", true),
            ("a/+", "a/b", true),
            ("a/+", "a/b/c", false),
            ("a/#", "a", true),
            ("a/#", "a/b/c", true),
            ("#", "a/b", true),
            ("+/b", "a/b", true),
            ("+", "/", false),
            ("+/+", "/", true),
            ("#", "$SYS/x", false),
            ("+/x", "$SYS/x", false),
            ("$SYS/#", "$SYS/x", true),
            ("inference/+/+/cam-03", "inference/yolo-edge/v3.2.1/cam-03", true),
        ];
        for (f, t, want) in cases {
            assert_eq!(matches(f, t), want, "{f} vs {t}");
        }
    }

    /// The reading `matches` had before it walked bytes: levels by `str::split`.
    fn matches_by_split(filter: &str, topic: &str) -> bool {
        if topic.starts_with('$') && filter.starts_with(['+', '#']) {
            return false;
        }
        let (mut f, mut t) = (filter.split('/'), topic.split('/'));
        loop {
            match (f.next(), t.next()) {
                (Some("#"), _) => return true,
                (Some("+"), Some(_)) => {}
                (Some(fl), Some(tl)) if fl == tl => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    proptest::proptest! {
        // Short strings over the characters that matter, so that levels, wildcards and empty
        // levels meet often; invalid filters too, which must read as they always did.
        #[test]
        fn matches_reads_as_split_did(filter in "[ab/+#$]{0,8}", topic in "[ab/+#$]{0,8}") {
            proptest::prop_assert_eq!(matches(&filter, &topic), matches_by_split(&filter, &topic));
        }
    }

    #[test]
    fn covers_subsets() {
        let cases = [
            ("#", "a/b", true),
            ("#", "#", true),
            ("a/#", "a/+/c", true),
            ("a/#", "a", true),
            ("a/+", "a/b", true),
            ("a/+", "a/+", true),
            ("a/+", "a/#", false),
            ("a/b", "a/+", false),
            ("a/+/#", "a/#", false),
            ("a/+", "a", false),
            ("a", "a/b", false),
            ("#", "$SYS/#", false),
            ("sensors/+/temp", "sensors/x/temp", true),
        ];
        for (o, i, want) in cases {
            assert_eq!(covers(o, i), want, "{o} covers {i}");
        }
    }

    #[test]
    fn covers_agrees_with_matches_on_samples() {
        // If outer covers inner, every sample topic inner matches must match outer.
        let filters = ["#", "a/#", "a/+", "a/b", "+/b", "a/+/c", "+/+", "a", "+"];
        let topics = ["a", "a/b", "a/c", "b/b", "a/b/c", "a/x/c", "x", "a/b/d"];
        for o in filters {
            for i in filters {
                if covers(o, i) {
                    for t in topics {
                        assert!(!matches(i, t) || matches(o, t), "{o} covers {i} but not {t}");
                    }
                }
            }
        }
    }
}
