//! Config value types with units: durations (`"250ms"`, `"5s"`) and byte sizes
//! (`"256 KiB"`, `"1 GiB"`), parsed once at load so the rest of the code sees typed values; and
//! the wall clock in the one unit records and marks carry it in.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 if the clock is before it.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written with a unit, as in `"100ms"`, `"5s"` or `"2m 30s"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }
}

impl From<HumanDuration> for Duration {
    fn from(d: HumanDuration) -> Duration {
        d.0
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_duration(self.0).fmt(f)
    }
}

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s.trim())
            .map(HumanDuration)
            .map_err(|e| format!("invalid duration {s:?}: {e} (write it with a unit, e.g. \"500ms\" or \"5s\")"))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A byte count written with a unit, as in `"256 KiB"`, `"64MiB"` or `"1 GB"`.
/// A bare integer is taken as bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const fn kib(n: u64) -> Self {
        Self(n * 1024)
    }

    pub const fn mib(n: u64) -> Self {
        Self(n * 1024 * 1024)
    }

    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// The size as a `usize`, saturating on 32-bit targets.
    pub fn as_usize(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        bytesize::ByteSize(self.0).display().iec().fmt(f)
    }
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim()
            .parse::<bytesize::ByteSize>()
            .map(|b| ByteSize(b.as_u64()))
            .map_err(|e| format!("invalid byte size {s:?}: {e} (write it with a unit, e.g. \"256 KiB\")"))
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `[log] format` of both binaries: `text` (colour only on a terminal) or `json` (one object a
/// line, for a log shipper).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// A binary's config file when none is named: the path in the environment variable `var`,
/// else `packaged` where it exists, else `checkout`.
pub fn default_config(var: &str, packaged: &str, checkout: &str) -> std::path::PathBuf {
    if let Some(path) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        return path.into();
    }
    let packaged = std::path::Path::new(packaged);
    if packaged.exists() { packaged.to_owned() } else { checkout.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Doc {
        d: HumanDuration,
        b: ByteSize,
    }

    #[test]
    fn parses_units() {
        let doc: Doc = toml::from_str("d = \"250ms\"\nb = \"256 KiB\"").unwrap();
        assert_eq!(doc.d.0, Duration::from_millis(250));
        assert_eq!(doc.b.0, 256 * 1024);
        let doc: Doc = toml::from_str("d = \"2m 30s\"\nb = 4096").unwrap();
        assert_eq!(doc.d.0, Duration::from_secs(150));
        assert_eq!(doc.b.0, 4096);
    }

    #[test]
    fn rejects_missing_unit_with_hint() {
        let err = toml::from_str::<Doc>("d = \"250\"\nb = 1").err().unwrap().to_string();
        assert!(err.contains("with a unit"), "{err}");
        let err = toml::from_str::<Doc>("d = \"1s\"\nb = \"lots\"").err().unwrap().to_string();
        assert!(err.contains("invalid byte size"), "{err}");
    }

    #[test]
    fn round_trips_through_display() {
        for s in ["1 KiB", "3 MiB", "17 B"] {
            let b: ByteSize = s.parse().unwrap();
            assert_eq!(b.to_string().parse::<ByteSize>().unwrap(), b, "{s}");
        }
        let d: HumanDuration = "1m 5s".parse().unwrap();
        assert_eq!(d.to_string().parse::<HumanDuration>().unwrap(), d);
    }
}
