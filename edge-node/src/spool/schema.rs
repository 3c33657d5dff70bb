//! The spool database's schema: its version, its tables and the constants both the storage
//! (`sqlite.rs`) and the migrations (`migrate.rs`) build their statements from. A leaf, so the
//! two never import each other's internals.

pub(super) const SCHEMA_VERSION: i64 = 2;

pub(super) const SCHEMA: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE lanes (lane INTEGER PRIMARY KEY, next_seq INTEGER NOT NULL, acked INTEGER NOT NULL);
";

/// One B-tree: the rowid is the key, `lane << 56 | seq` (see `sqlite::key`). `lane` and `seq` are
/// computed columns for people and the read-only tools; the spool's own statements use `id`
/// ranges, which the planner serves straight from the table's B-tree.
pub(super) const RECORDS: &str = "
CREATE TABLE records (
    id INTEGER PRIMARY KEY,
    lane INTEGER AS (id >> 56) VIRTUAL,
    seq INTEGER AS (id & 72057594037927935) VIRTUAL,
    kind INTEGER NOT NULL,
    durability INTEGER NOT NULL,
    class TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    enqueued_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    user_properties TEXT,
    correlation_data BLOB,
    content_type TEXT,
    schema TEXT
);
";

/// The schema a message was validated against (`subject/version/id`), added without a version
/// step: a spool without the column gets it at its next open (SQLite adds a column without
/// rewriting a row), and an older build, which names the columns it writes and reads, leaves
/// it empty and ignores it.
pub(super) const SCHEMA_COLUMN: &str = "ALTER TABLE records ADD COLUMN schema TEXT";

/// Whether `conn`'s records table has the schema column.
pub(super) fn has_schema_column(conn: &rusqlite::Connection) -> bool {
    conn.prepare("SELECT schema FROM records LIMIT 0").is_ok()
}

/// Message records and their bytes per class, kept in the same transaction as every change of
/// the records (with the lanes they match in `meta.usage_lanes`), so no open has to count them.
/// Added without a version step: a spool without it gets it, counted once, at its next open.
pub(super) const USAGE: &str = "CREATE TABLE IF NOT EXISTS class_usage \
    (class TEXT PRIMARY KEY, records INTEGER NOT NULL, bytes INTEGER NOT NULL) WITHOUT ROWID";

/// Messages with a TTL, for expiry.
pub(super) const EXPIRY_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS records_expiry ON records (expires_ms) WHERE kind = 0 AND expires_ms IS NOT NULL";

/// Seqs are below 2^56, lanes below 127 (so the next lane's first key still fits an i64).
pub(super) const SEQ_BITS: u32 = 56;
pub(super) const MAX_LANE: u8 = 126;

/// Record kinds.
pub(super) const KIND_MESSAGE: i64 = 0;
pub(super) const KIND_GAP: i64 = 1;

/// Per-record bytes beyond payload, topic and properties that eviction counts (key, header).
pub(super) const RECORD_OVERHEAD: i64 = 64;

/// A message's bytes as class quotas and usage count them: payload and topic, as
/// [`super::message_size`] computes them before the record is written.
pub(super) const MESSAGE_SIZE: &str = "(length(payload) + octet_length(topic))";

/// QoS 2 receipts whose messages the spool took (`Spool::append`): a message resent under a
/// receipt the spool holds is not taken again. Written with the record, kept after it is
/// acked (a resend may come after), forgotten when the receipt is released. An older build
/// ignores the table.
pub(super) const RECEIPTS: &str =
    "CREATE TABLE IF NOT EXISTS receipts (key INTEGER PRIMARY KEY, lane INTEGER NOT NULL, seq INTEGER NOT NULL)";
