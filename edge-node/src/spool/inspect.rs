//! Read-only views of a spool database for operators: `edge-node spool stats` and
//! `edge-node spool export`. They open the database read-only, so they work while the node runs
//! (WAL readers do not block the writer) and never change it.

use std::io::Write;
use std::path::Path;

use base64::Engine;
use rusqlite::{Connection, OpenFlags, params};
use serde::Serialize;

use super::SpoolError;

/// Per lane counts.
#[derive(Debug, Serialize)]
pub struct LaneStats {
    pub lane: u8,
    pub next_seq: u64,
    pub acked: u64,
    pub messages: u64,
    pub gap_records: u64,
    pub bytes: u64,
    pub oldest_enqueued_ms: Option<u64>,
}

/// Per class counts.
#[derive(Debug, Serialize)]
pub struct ClassStats {
    pub class: String,
    pub messages: u64,
    pub bytes: u64,
    /// Records the class lost to eviction and expiry, as counted by its gap records still held.
    pub dropped: u64,
}

#[derive(Debug, Serialize)]
pub struct Stats {
    pub path: String,
    pub epoch: String,
    pub schema_version: String,
    pub database_bytes: u64,
    pub wal_bytes: u64,
    pub lanes: Vec<LaneStats>,
    pub classes: Vec<ClassStats>,
}

fn open(path: &Path) -> Result<Connection, SpoolError> {
    if !path.exists() {
        return Err(SpoolError::Io {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no spool database here (no class routes to the cloud yet?)",
            ),
        });
    }
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|source| SpoolError::Sqlite { path: path.to_owned(), source })
}

/// The record columns both schema versions have (version 2 computes `lane` and `seq`).
const COLUMNS: &str = "lane, seq, kind, class, topic, payload, qos, enqueued_ms, expires_ms, user_properties, \
                       correlation_data, content_type";

/// Where the records are and the cheapest `ORDER BY` for lane and seq order. A node that is
/// migrating its spool has records in two tables; a version 1 spool is keyed by `(lane, seq)`,
/// a version 2 spool by `id`, which sorts the same way.
fn records(conn: &Connection) -> rusqlite::Result<(String, &'static str)> {
    let has = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).map(|n| n > 0);
    if has("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'records_v2'")? {
        return Ok((
            format!("(SELECT {COLUMNS} FROM records UNION ALL SELECT {COLUMNS} FROM records_v2)"),
            "lane, seq",
        ));
    }
    let keyed_by_id = has("SELECT count(*) FROM pragma_table_info('records') WHERE name = 'id'")?;
    Ok(("records".to_owned(), if keyed_by_id { "id" } else { "lane, seq" }))
}

/// Writes a consistent copy of the spool at `path` to `to` (which must not exist), while the
/// node runs or not: one read transaction (`VACUUM INTO`), so the copy holds every commit up
/// to a moment, the WAL's included, and none after. Copying `spool.db` alone is no backup: its
/// last commits may still be in the WAL. Returns the copy's stats.
pub fn backup(path: &Path, to: &Path) -> Result<Stats, SpoolError> {
    if to.exists() {
        return Err(SpoolError::Io {
            path: to.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "the backup file exists; name a new one"),
        });
    }
    let conn = open(path)?;
    let target = to.to_str().ok_or_else(|| SpoolError::Io {
        path: to.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a UTF-8 path"),
    })?;
    conn.execute("VACUUM INTO ?1", [target]).map_err(|source| SpoolError::Sqlite { path: to.to_owned(), source })?;
    stats(to)
}

pub fn stats(path: &Path) -> Result<Stats, SpoolError> {
    let conn = open(path)?;
    let err = |source| SpoolError::Sqlite { path: path.to_owned(), source };
    let meta = |key: &str| conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get::<_, String>(0));
    let epoch = meta("epoch").map_err(err)?;
    let schema_version = meta("schema_version").map_err(err)?;
    let (records, _) = records(&conn).map_err(err)?;
    let mut lanes = Vec::new();
    {
        // One pass over the records for all lanes, then the lanes table's counters.
        let mut stmt = conn
            .prepare(&format!(
                "SELECT lane, sum(kind = 0), sum(kind = 1), coalesce(sum(length(payload) + length(topic)), 0), \
                 min(CASE WHEN kind = 0 THEN enqueued_ms END) FROM {records} GROUP BY lane"
            ))
            .map_err(err)?;
        let held = stmt
            .query_map([], |r| Ok((r.get::<_, u8>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))))
            .map_err(err)?
            .collect::<Result<std::collections::BTreeMap<u8, (u64, u64, u64, Option<u64>)>, _>>()
            .map_err(err)?;
        let mut stmt = conn.prepare("SELECT lane, next_seq, acked FROM lanes ORDER BY lane").map_err(err)?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, u8>(0)?, r.get(1)?, r.get(2)?))).map_err(err)?;
        for row in rows {
            let (lane, next_seq, acked) = row.map_err(err)?;
            let (messages, gap_records, bytes, oldest_enqueued_ms) = held.get(&lane).copied().unwrap_or_default();
            lanes.push(LaneStats { lane, next_seq, acked, messages, gap_records, bytes, oldest_enqueued_ms });
        }
    }
    let mut classes = Vec::new();
    {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT class, sum(kind = 0), coalesce(sum(CASE WHEN kind = 0 THEN length(payload) + length(topic) END), 0), \
                 coalesce(sum(CASE WHEN kind = 1 THEN json_extract(payload, '$.count') END), 0) \
                 FROM {records} GROUP BY class ORDER BY class"
            ))
            .map_err(err)?;
        let rows = stmt
            .query_map([], |r| {
                Ok(ClassStats { class: r.get(0)?, messages: r.get(1)?, bytes: r.get(2)?, dropped: r.get(3)? })
            })
            .map_err(err)?;
        for row in rows {
            classes.push(row.map_err(err)?);
        }
    }
    let size = |suffix: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        std::fs::metadata(std::path::PathBuf::from(p)).map_or(0, |m| m.len())
    };
    Ok(Stats {
        path: path.display().to_string(),
        epoch,
        schema_version,
        database_bytes: size(""),
        wal_bytes: size("-wal"),
        lanes,
        classes,
    })
}

/// Writes every unacked record as one JSON object a line, lane by lane in seq order: messages
/// with their payload (as text when it is UTF-8, else base64), gap records with their body.
pub fn export(path: &Path, out: &mut impl Write) -> Result<u64, SpoolError> {
    let conn = open(path)?;
    let err = |source| SpoolError::Sqlite { path: path.to_owned(), source };
    let (records, order) = records(&conn).map_err(err)?;
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM {records} ORDER BY {order}")).map_err(err)?;
    let mut rows = stmt.query(params![]).map_err(err)?;
    let mut count = 0;
    let b64 = base64::engine::general_purpose::STANDARD;
    while let Some(r) = rows.next().map_err(err)? {
        let get_err = |e| SpoolError::Sqlite { path: path.to_owned(), source: e };
        let payload: Vec<u8> = r.get(5).map_err(get_err)?;
        let kind: i64 = r.get(2).map_err(get_err)?;
        let mut doc = serde_json::json!({
            "lane": r.get::<_, u8>(0).map_err(get_err)?,
            "seq": r.get::<_, u64>(1).map_err(get_err)?,
            "class": r.get::<_, String>(3).map_err(get_err)?,
        });
        if kind == 1 {
            doc["gap"] = serde_json::from_slice(&payload).unwrap_or(serde_json::Value::Null);
        } else {
            doc["topic"] = r.get::<_, String>(4).map_err(get_err)?.into();
            match String::from_utf8(payload) {
                Ok(text) => doc["payload"] = text.into(),
                Err(e) => doc["payload_base64"] = b64.encode(e.as_bytes()).into(),
            }
            doc["qos"] = r.get::<_, u8>(6).map_err(get_err)?.into();
            doc["enqueued_ms"] = r.get::<_, u64>(7).map_err(get_err)?.into();
            if let Some(exp) = r.get::<_, Option<u64>>(8).map_err(get_err)? {
                doc["expires_ms"] = exp.into();
            }
            if let Some(user) = r.get::<_, Option<String>>(9).map_err(get_err)? {
                doc["user_properties"] = serde_json::from_str(&user).unwrap_or(serde_json::Value::Null);
            }
            if let Some(corr) = r.get::<_, Option<Vec<u8>>>(10).map_err(get_err)? {
                doc["correlation_data_base64"] = b64.encode(corr).into();
            }
            if let Some(ct) = r.get::<_, Option<String>>(11).map_err(get_err)? {
                doc["content_type"] = ct.into();
            }
        }
        writeln!(out, "{doc}").map_err(|source| SpoolError::Io { path: path.to_owned(), source })?;
        count += 1;
    }
    Ok(count)
}
