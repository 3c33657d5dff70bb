//! The file's tables, made if missing, and the migrations of files written by earlier
//! versions: every concern's, in one place, so the file is one schema opened once.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

/// Records, their marks, the edges' epochs and dictionaries, the fleet view's states and TCO
/// reports.
const RECORDS: &str = "
CREATE TABLE IF NOT EXISTS records (
    edge_id TEXT NOT NULL,
    epoch TEXT NOT NULL,
    lane INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    class TEXT NOT NULL,
    topic TEXT,
    payload BLOB NOT NULL,
    qos INTEGER,
    enqueued_ms INTEGER,
    headers TEXT,
    received_ms INTEGER NOT NULL,
    PRIMARY KEY (edge_id, epoch, lane, seq)
);
CREATE TABLE IF NOT EXISTS marks (
    edge_id TEXT NOT NULL,
    epoch TEXT NOT NULL,
    lane INTEGER NOT NULL,
    committed INTEGER NOT NULL,
    PRIMARY KEY (edge_id, epoch, lane)
);
CREATE TABLE IF NOT EXISTS tco_reports (
    edge_id TEXT PRIMARY KEY,
    received_ms INTEGER NOT NULL,
    report TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS edge_epochs (
    edge_id TEXT PRIMARY KEY,
    epochs TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS fleet_edges (
    edge_id TEXT PRIMARY KEY,
    session INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS fleet_bridges (
    name TEXT PRIMARY KEY,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS edge_dicts (
    edge_id TEXT NOT NULL,
    id TEXT NOT NULL,
    class TEXT NOT NULL,
    bytes BLOB NOT NULL,
    stored_ms INTEGER NOT NULL,
    PRIMARY KEY (edge_id, id)
);
";

const DOWNLINK: &str = "
CREATE TABLE IF NOT EXISTS downlink (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    edge_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    message TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    stored_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS downlink_edges (
    edge_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    delivered INTEGER NOT NULL,
    refused INTEGER NOT NULL,
    expired INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS downlink_dead (
    edge_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    topic TEXT NOT NULL,
    outcome TEXT NOT NULL,
    reason TEXT NOT NULL,
    payload BLOB NOT NULL,
    message TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    PRIMARY KEY (edge_id, seq)
);
CREATE TABLE IF NOT EXISTS downlink_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS downlink_ids (
    edge_id TEXT NOT NULL,
    id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    stored_ms INTEGER NOT NULL,
    PRIMARY KEY (edge_id, id)
) WITHOUT ROWID;
";

/// Brings a file's downlink tables to the current layout (see the module doc); run at open,
/// after [`DOWNLINK`].
fn migrate_downlink(conn: &mut Connection) -> rusqlite::Result<()> {
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('downlink')")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if !columns.iter().any(|c| c == "id") {
        // Schema 1: `seq` was the row id, shared by every edge.
        let floor: u64 = tx
            .query_row("SELECT seq FROM sqlite_sequence WHERE name = 'downlink'", [], |r| r.get(0))
            .optional()?
            .unwrap_or(0);
        tx.execute_batch(
            "ALTER TABLE downlink RENAME TO downlink_v1;
             DROP INDEX IF EXISTS downlink_by_edge;
             CREATE TABLE downlink (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 edge_id TEXT NOT NULL,
                 seq INTEGER NOT NULL,
                 topic TEXT NOT NULL,
                 payload BLOB NOT NULL,
                 message TEXT NOT NULL,
                 bytes INTEGER NOT NULL,
                 stored_ms INTEGER NOT NULL
             );
             INSERT INTO downlink (id, edge_id, seq, topic, payload, message, bytes, stored_ms)
                 SELECT seq, edge_id, seq, topic, payload, message, bytes, stored_ms FROM downlink_v1;
             DROP TABLE downlink_v1;",
        )?;
        tx.execute("INSERT OR REPLACE INTO downlink_meta (key, value) VALUES ('floor', ?1)", [floor])?;
    }
    let edge_columns: Vec<String> = tx
        .prepare("SELECT name FROM pragma_table_info('downlink_edges')")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if !edge_columns.iter().any(|c| c == "last_seq") {
        tx.execute_batch("ALTER TABLE downlink_edges ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0")?;
    }
    tx.execute_batch("CREATE UNIQUE INDEX IF NOT EXISTS downlink_by_edge_seq ON downlink (edge_id, seq)")?;
    tx.commit()
}

const SCHEMAS: &str = "
CREATE TABLE IF NOT EXISTS schema_versions (
    subject TEXT NOT NULL,
    version INTEGER NOT NULL,
    id TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (subject, version)
);
CREATE TABLE IF NOT EXISTS schema_subjects (
    subject TEXT PRIMARY KEY,
    compatibility TEXT NOT NULL
);
";

/// Makes what is missing and migrates what an earlier version wrote; `what` names the step that
/// failed.
pub(super) fn create(conn: &mut Connection) -> Result<(), (&'static str, rusqlite::Error)> {
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")
        .and_then(|_| conn.execute_batch(RECORDS))
        .and_then(|_| conn.execute_batch(DOWNLINK))
        .and_then(|_| conn.execute_batch(SCHEMAS))
        .map_err(|e| ("schema", e))?;
    migrate_downlink(conn).map_err(|e| ("downlink schema", e))
}
