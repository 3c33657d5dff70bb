//! Why a sink call failed, by kind, with the backend's own code where it gave one.

/// Why a sink call failed, by kind, with the sink's own code where it gave one. `what` names
/// the call (`mark`, `read dicts`, ...); `key` what it was about, where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// No answer: the connection is down, a request timed out, no server responded. The
    /// moment's; a write is retried ([`Retry`]).
    #[error("sink {what}: unavailable: {reason}")]
    Unavailable { what: &'static str, reason: String },
    /// JetStream answered with an API error: `code` is its `err_code` (nats-server's
    /// `errors.json`), where it gave one.
    #[error("sink {what}: JetStream error{}: {reason}", code.map(|c| format!(" {c}")).unwrap_or_default())]
    JetStream { what: &'static str, code: Option<u64>, reason: String },
    /// Kafka answered with an error: `code` is librdkafka's error code (the broker's own codes
    /// are among them), where it gave one.
    #[error("sink {what}: Kafka error{}: {reason}", code.map(|c| format!(" {c}")).unwrap_or_default())]
    Kafka { what: &'static str, code: Option<i32>, reason: String },
    /// Another bridge took over what this one was writing (Kafka fenced its producer): the
    /// session ends, its edge is the other bridge's now.
    #[error("sink {what}: {key} taken over by another bridge (producer fenced)")]
    Fenced { what: &'static str, key: String },
    /// SQLite failed: `code` is its extended result code (`SQLITE_BUSY` 5, `SQLITE_FULL` 13, ...).
    #[error("sink {what}: SQLite error {code}: {reason}")]
    Sqlite { what: &'static str, code: i32, reason: String },
    /// A value the sink holds does not parse (a mark, a state, an index, a report).
    #[error("sink {what}: {key} unreadable: {reason}")]
    Corrupt { what: &'static str, key: String, reason: String },
    /// A compare-and-set found the value changed by another writer every time.
    #[error("sink {what}: {key} changed under each of {attempts} attempts (other bridges writing it)")]
    Conflict { what: &'static str, key: String, attempts: u32 },
    /// The call cannot be done with what it was given (not a dictionary id, an empty record);
    /// trying again changes nothing.
    #[error("sink {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// A record JetStream refuses for itself that could not be set aside either.
    #[error("sink publish: record refused ({reason}): {detail}")]
    Refused { reason: &'static str, detail: String },
    /// A file or directory of the sink.
    #[error("sink {what}: {path}: {source}")]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The bridge's own task doing the call ended without an answer (a panic, a cancel).
    #[error("sink {what}: task ended: {reason}")]
    Task { what: &'static str, reason: String },
}

impl SinkError {
    /// The kind as a short label, for logs and metrics.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            SinkError::Unavailable { .. } => "unavailable",
            SinkError::JetStream { .. } => "jetstream",
            SinkError::Kafka { .. } => "kafka",
            SinkError::Fenced { .. } => "fenced",
            SinkError::Sqlite { .. } => "sqlite",
            SinkError::Corrupt { .. } => "corrupt",
            SinkError::Conflict { .. } => "conflict",
            SinkError::Invalid { .. } => "invalid",
            SinkError::Refused { .. } => "refused",
            SinkError::Io { .. } => "io",
            SinkError::Task { .. } => "task",
        }
    }

    /// From a SQLite error: its extended code, or `Corrupt` for a value of the wrong type.
    pub(crate) fn sqlite(what: &'static str, e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::SqliteFailure(f, msg) => {
                SinkError::Sqlite { what, code: f.extended_code, reason: msg.unwrap_or_else(|| f.to_string()) }
            }
            e @ (rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)) => {
                SinkError::Corrupt { what, key: "a row".into(), reason: e.to_string() }
            }
            e => SinkError::Sqlite { what, code: 1, reason: e.to_string() },
        }
    }

    /// From a NATS client error: `JetStream` with its code if the server answered with an API
    /// error anywhere in the chain, `Unavailable` otherwise; `key` goes into the reason.
    pub(crate) fn nats(what: &'static str, key: &str, e: &(dyn std::error::Error + 'static)) -> Self {
        let reason = if key.is_empty() { e.to_string() } else { format!("{key}: {e}") };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(j) = c.downcast_ref::<async_nats::jetstream::Error>() {
                return SinkError::JetStream { what, code: Some(j.error_code().0), reason };
            }
            cause = c.source();
        }
        SinkError::Unavailable { what, reason }
    }

    /// A stored value of `key` that does not parse.
    pub(crate) fn corrupt(what: &'static str, key: impl std::fmt::Display, e: impl std::fmt::Display) -> Self {
        SinkError::Corrupt { what, key: key.to_string(), reason: e.to_string() }
    }

    /// A call given what it cannot take.
    pub(crate) fn invalid(what: &'static str, reason: impl std::fmt::Display) -> Self {
        SinkError::Invalid { what, reason: reason.to_string() }
    }
}
