//! Schema migrations of the spool database, oldest first.
//!
//! A migration must never strand a spool: the node that runs it may be on a nearly full disk,
//! and may lose power halfway. So records move in small transactions from the old table to the
//! new one (each chunk inserted and deleted in the same transaction), the old table's freed
//! pages are reused by the next chunk, and the WAL is checkpointed between chunks. The file
//! grows by about one chunk, not by a copy of the spool. A migration cut short resumes where it
//! stopped at the next open; the schema version changes only in the transaction that ends it.
//! A migration that fails leaves the database as it was after its last chunk and is reported,
//! never moved aside: the data in it is good, only this build could not finish the move.

use rusqlite::{Connection, OptionalExtension, params};

use super::schema::{MAX_LANE, RECORDS, SEQ_BITS};

/// Records per migration transaction: about 4 MiB of 1 KiB messages.
const CHUNK: i64 = 4096;

/// Version 1 kept each record twice over: a rowid table plus the `(lane, seq)` key's index, so
/// every insert, read and delete walked two B-trees. Version 2 keys records by one integer,
/// `lane << 56 | seq`, as the rowid itself.
#[cfg(test)]
pub(super) const RECORDS_V1: &str = "
CREATE TABLE records (
    lane INTEGER NOT NULL,
    seq INTEGER NOT NULL,
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
    PRIMARY KEY (lane, seq)
);
";

/// The columns both versions share, in one order.
const COLUMNS: &str = "kind, durability, class, topic, payload, qos, enqueued_ms, expires_ms, user_properties, \
                       correlation_data, content_type";

/// Moves every record of a version 1 database into the version 2 table, `records_v2` until
/// the move is done, and sets the version.
pub(super) fn v1_to_v2(conn: &Connection) -> rusqlite::Result<()> {
    let exists: i64 =
        conn.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'records_v2'", [], |r| {
            r.get(0)
        })?;
    let unkeyable: i64 = conn.query_row(
        &format!(
            "SELECT count(*) FROM records WHERE lane NOT BETWEEN 0 AND {MAX_LANE} \
             OR seq NOT BETWEEN 0 AND {}",
            (1u64 << SEQ_BITS) - 1
        ),
        [],
        |r| r.get(0),
    )?;
    if unkeyable > 0 {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT),
            Some(format!("{unkeyable} records have a lane or seq outside version 2's key (lane << 56 | seq)")),
        ));
    }
    if exists == 0 {
        create_v2(conn)?;
    }
    let left: i64 = conn.query_row("SELECT count(*) FROM records", [], |r| r.get(0))?;
    if left > 0 {
        tracing::info!(records = left, "spool schema 1 to 2: moving records to a single-key table");
    }
    while move_chunk(conn)? > 0 {
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    }
    let tx = conn.unchecked_transaction()?;
    tx.execute_batch(
        "DROP TABLE records; ALTER TABLE records_v2 RENAME TO records; \
         UPDATE meta SET value = '2' WHERE key = 'schema_version';",
    )?;
    tx.commit()?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

/// The current `records` table under the name `records_v2`.
fn create_v2(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(&RECORDS.replacen("CREATE TABLE records", "CREATE TABLE records_v2", 1))
}

/// Moves the next chunk (by the old table's rowid) in one transaction; returns how many.
pub(super) fn move_chunk(conn: &Connection) -> rusqlite::Result<usize> {
    let tx = conn.unchecked_transaction()?;
    let end: i64 = tx
        .query_row("SELECT rowid FROM records ORDER BY rowid LIMIT 1 OFFSET ?1", [CHUNK - 1], |r| r.get(0))
        .optional()?
        .unwrap_or(i64::MAX);
    let moved = tx.execute(
        &format!(
            "INSERT INTO records_v2 (id, {COLUMNS}) SELECT (lane << {SEQ_BITS}) | seq, {COLUMNS} FROM records \
             WHERE rowid <= ?1"
        ),
        params![end],
    )?;
    tx.execute("DELETE FROM records WHERE rowid <= ?1", params![end])?;
    tx.commit()?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use bytes::Bytes;

    use super::super::*;
    use super::*;

    /// A spool written by this build, turned back into a version 1 database: 9,000 messages of
    /// 1 KiB over two lanes (three chunks), `full` ones, MQTT 5 properties and an expiry gap.
    /// Returns every record as this build reads it.
    fn version_1_spool(path: &Path) -> Vec<Record> {
        let mut spool = Spool::new(SqliteStorage::open(path).unwrap());
        for i in 0..9_000u32 {
            let lane = Lane(if i % 3 == 0 { 5 } else { 0 });
            let mut message = Message {
                class: if i % 2 == 0 { "telemetry" } else { "events" }.into(),
                topic: format!("telemetry/cam-{}/metrics", i % 7),
                payload: Bytes::from(vec![(i % 251) as u8; 1024]),
                qos: 1,
                enqueued_ms: 1_000 + u64::from(i),
                expires_ms: (i % 1000 == 1).then_some(5_000),
                properties: Properties::default(),
            };
            if i % 100 == 0 {
                message.properties.user = vec![("model".into(), format!("v{i}"))];
                message.properties.correlation_data = Some(Bytes::from(i.to_be_bytes().to_vec()));
                message.properties.content_type = Some("application/json".into());
            }
            let durability = if i % 10 == 0 { Durability::Full } else { Durability::Normal };
            spool.append(lane, message, durability);
        }
        spool.flush().unwrap();
        assert!(spool.expire(10_000).unwrap() > 0, "the fixture needs a gap record");
        let mut all = spool.read(Lane(0), Seq(0), 100_000).unwrap();
        all.extend(spool.read(Lane(5), Seq(0), 100_000).unwrap());
        drop(spool);
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(&format!(
            "BEGIN; {} INSERT INTO records_old (lane, seq, {COLUMNS}) SELECT lane, seq, {COLUMNS} FROM records; \
             DROP TABLE records; ALTER TABLE records_old RENAME TO records; \
             UPDATE meta SET value = '1' WHERE key = 'schema_version'; COMMIT; VACUUM;",
            RECORDS_V1.replacen("CREATE TABLE records", "CREATE TABLE records_old", 1)
        ))
        .unwrap();
        all
    }

    fn read_all(path: &Path) -> (Vec<Record>, Opened) {
        let mut storage = SqliteStorage::open(path).unwrap();
        let opened = storage.opened().clone();
        let mut all = storage.read(Lane(0), Seq(0), 100_000).unwrap();
        all.extend(storage.read(Lane(5), Seq(0), 100_000).unwrap());
        (all, opened)
    }

    fn schema_version(path: &Path) -> String {
        let conn = Connection::open(path).unwrap();
        conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_version_1_spool_opens_migrated_with_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let before = version_1_spool(&path);
        let opened_v1 = {
            let conn = Connection::open(&path).unwrap();
            conn.query_row("SELECT value FROM meta WHERE key = 'epoch'", [], |r| r.get::<_, String>(0)).unwrap()
        };
        assert_eq!(schema_version(&path), "1");
        let (after, opened) = read_all(&path);
        assert_eq!(schema_version(&path), "2");
        assert_eq!(opened.epoch, opened_v1, "a migration keeps the epoch");
        assert!(opened.moved_aside.is_none());
        assert_eq!(after.len(), before.len());
        assert!(after == before, "records changed in the migration");
        let gaps = after.iter().filter(|r| matches!(r.body, Body::Gap(_))).count();
        assert!(gaps > 0 && after.iter().any(|r| r.durability == Durability::Full));
        // Usage counted at open matches what the records hold.
        let bytes: u64 = before.iter().filter_map(Record::message).map(message_size).sum();
        assert_eq!(opened.usage.iter().map(|u| u.bytes).sum::<u64>(), bytes);
        // And the node goes on from there: seqs continue, acks delete.
        let mut spool = Spool::new(SqliteStorage::open(&path).unwrap());
        let next = spool.append(Lane(0), before.iter().find_map(Record::message).unwrap().clone(), Durability::Normal);
        assert!(next > before.iter().filter(|r| r.lane == Lane(0)).map(|r| r.seq).max().unwrap());
        spool.flush().unwrap();
        spool.ack(Lane(0), next).unwrap();
        assert!(spool.read(Lane(0), Seq(0), 10).unwrap().is_empty());
        assert!(!spool.read(Lane(5), Seq(0), 10).unwrap().is_empty());
    }

    #[test]
    fn a_migration_needs_room_for_a_chunk_not_a_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let before = version_1_spool(&path);
        // One chunk of 4,096 1 KiB records is about 1,100 pages of 4 KiB; the spool is 2,500.
        let conn = with_room(&path, 1_500);
        v1_to_v2(&conn).unwrap();
        drop(conn);
        assert_eq!(schema_version(&path), "2");
        assert!(read_all(&path).0 == before);
    }

    /// A connection that may grow the file by `pages` pages and no more.
    fn with_room(path: &Path, pages: i64) -> Connection {
        let conn = Connection::open(path).unwrap();
        let now: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        conn.query_row(&format!("PRAGMA max_page_count = {}", now + pages), [], |_| Ok(())).unwrap();
        conn
    }

    fn count(conn: &Connection, table: &str) -> usize {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get::<_, i64>(0)).unwrap() as usize
    }

    #[test]
    fn a_full_disk_stops_a_migration_without_losing_a_record_and_the_next_open_finishes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let before = version_1_spool(&path);
        // Not one page more: the migration cannot even create its table.
        let conn = with_room(&path, 0);
        let err = v1_to_v2(&conn).unwrap_err();
        assert_eq!(err.sqlite_error_code(), Some(rusqlite::ErrorCode::DiskFull), "{err}");
        assert_eq!(count(&conn, "records"), before.len());
        drop(conn);
        assert_eq!(schema_version(&path), "1");
        let (after, opened) = read_all(&path);
        assert!(opened.moved_aside.is_none());
        assert_eq!(schema_version(&path), "2");
        assert!(after == before, "records changed across the failed migration");
    }

    #[test]
    fn a_migration_cut_short_resumes_at_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        let before = version_1_spool(&path);
        let conn = Connection::open(&path).unwrap();
        move_chunk_after_create(&conn);
        // The power goes here: one chunk moved, the rest not, the version still 1.
        assert_eq!(count(&conn, "records_v2"), CHUNK as usize);
        assert_eq!(count(&conn, "records") + count(&conn, "records_v2"), before.len());
        drop(conn);
        assert_eq!(schema_version(&path), "1");
        let stats = inspect::stats(&path).unwrap();
        let held: u64 = stats.lanes.iter().map(|l| l.messages + l.gap_records).sum();
        assert_eq!(held as usize, before.len(), "the read-only tools see both tables while migrating");
        let (after, _) = read_all(&path);
        assert_eq!(schema_version(&path), "2");
        assert!(after == before, "records changed across the interrupted migration");
    }

    fn move_chunk_after_create(conn: &Connection) {
        create_v2(conn).unwrap();
        assert_eq!(move_chunk(conn).unwrap(), CHUNK as usize);
    }

    #[test]
    fn a_failed_migration_is_refused_and_not_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spool.db");
        version_1_spool(&path);
        // A record this build cannot key (its seq does not fit 56 bits).
        let conn = Connection::open(&path).unwrap();
        conn.execute(
            &format!(
                "INSERT INTO records (lane, seq, {COLUMNS}) SELECT 0, 72057594037927937, {COLUMNS} FROM records \
                 WHERE lane = 0 AND seq = 2"
            ),
            [],
        )
        .unwrap();
        drop(conn);
        let err = SqliteStorage::open(&path).unwrap_err();
        assert!(matches!(err, SpoolError::Migration { from: 1, to: 2, .. }), "{err}");
        assert!(err.to_string().contains("migrating schema version 1 to 2"), "{err}");
        assert!(path.exists(), "a spool that failed to migrate stays where it is");
        assert_eq!(schema_version(&path), "1");
    }
}
