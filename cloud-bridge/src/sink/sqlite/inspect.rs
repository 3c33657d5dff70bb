//! What reached the SQLite sink, for an operator's commands (`sink::inspect`), read from the
//! file opened read-only, beside a running bridge or without one.

use std::collections::BTreeMap;
use std::path::Path;

use crate::sink::SinkError;
use crate::sink::seen::Seen;

/// The last `n` records stored (of `edge`, if given), oldest first.
pub(crate) fn tail(path: &Path, edge: Option<&str>, n: usize) -> Result<Vec<Seen>, SinkError> {
    let conn = open_read_only(path)?;
    let mut stmt = conn
        .prepare(
            "SELECT edge_id, epoch, lane, seq, kind, topic, payload, headers FROM records \
             WHERE ?1 IS NULL OR edge_id = ?1 ORDER BY rowid DESC LIMIT ?2",
        )
        .map_err(|e| sqlite("tail", &e))?;
    let rows = stmt
        .query_map(rusqlite::params![edge, n as i64], |r| {
            let headers: Option<String> = r.get(7)?;
            let payload: Vec<u8> = r.get(6)?;
            let pairs: Vec<(String, String)> = headers.and_then(|h| serde_json::from_str(&h).ok()).unwrap_or_default();
            Ok(Seen {
                edge: r.get(0)?,
                id: format!("{}:{}:{}", r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?),
                kind: r.get(4)?,
                topic: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
                bytes: payload.len(),
                payload: Seen::payload(&payload),
                headers: pairs.into_iter().collect(),
            })
        })
        .map_err(|e| sqlite("tail", &e))?;
    let mut out = rows.collect::<Result<Vec<_>, _>>().map_err(|e| sqlite("tail", &e))?;
    out.reverse();
    Ok(out)
}

/// Records stored per edge (messages and gap records together).
pub(crate) fn count(path: &Path) -> Result<BTreeMap<String, u64>, SinkError> {
    let conn = open_read_only(path)?;
    let mut stmt =
        conn.prepare("SELECT edge_id, COUNT(*) FROM records GROUP BY edge_id").map_err(|e| sqlite("count", &e))?;
    let rows =
        stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?))).map_err(|e| sqlite("count", &e))?;
    rows.collect::<Result<_, _>>().map_err(|e| sqlite("count", &e))
}

fn open_read_only(path: &Path) -> Result<rusqlite::Connection, SinkError> {
    rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| sqlite("open", &e))
}

fn sqlite(what: &'static str, e: &rusqlite::Error) -> SinkError {
    let code = match e {
        rusqlite::Error::SqliteFailure(f, _) => f.extended_code,
        _ => 0,
    };
    SinkError::Sqlite { what, code, reason: e.to_string() }
}
