//! The registry in the SQLite sink: `schema_versions` and `schema_subjects`.

use rusqlite::{OptionalExtension, params};
use shared::schema::{Compatibility, Version};

use super::SqliteSink;
use crate::sink::error::SinkError;
use crate::sink::schemas::{SchemaStore, Subject, from_json, parse_mode, subjects, to_json};

impl SchemaStore for SqliteSink {
    async fn schema_versions(&self, subject: &str) -> Result<Vec<Version>, SinkError> {
        let subject = subject.to_owned();
        self.blocking(move |conn| {
            let mut read = conn
                .prepare_cached("SELECT version, doc FROM schema_versions WHERE subject = ?1 ORDER BY version")
                .map_err(|e| SinkError::sqlite("schema versions", e))?;
            let rows = read
                .query_map(params![subject], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, String>(1)?)))
                .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                .map_err(|e| SinkError::sqlite("schema versions", e))?;
            rows.iter().map(|(v, doc)| from_json(&format!("{subject} {v}"), doc.as_bytes())).collect()
        })
        .await
    }

    async fn schema_put(&self, v: &Version) -> Result<bool, SinkError> {
        let (v, doc) = (v.clone(), to_json(v)?);
        self.blocking(move |conn| {
            conn.execute(
                "INSERT OR IGNORE INTO schema_versions (subject, version, id, doc) VALUES (?1, ?2, ?3, ?4)",
                params![v.subject, v.version, v.id, doc],
            )
            .map(|n| n == 1)
            .map_err(|e| SinkError::sqlite("schema version", e))
        })
        .await
    }

    async fn schema_mode(&self, subject: &str) -> Result<Option<Compatibility>, SinkError> {
        let subject = subject.to_owned();
        self.blocking(move |conn| {
            let mode: Option<String> = conn
                .query_row("SELECT compatibility FROM schema_subjects WHERE subject = ?1", params![subject], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(|e| SinkError::sqlite("schema mode", e))?;
            mode.map(|m| parse_mode(&subject, &m)).transpose()
        })
        .await
    }

    async fn schema_set_mode(&self, subject: &str, mode: Compatibility) -> Result<(), SinkError> {
        let subject = subject.to_owned();
        self.blocking(move |conn| {
            conn.execute(
                "INSERT INTO schema_subjects (subject, compatibility) VALUES (?1, ?2) \
                 ON CONFLICT (subject) DO UPDATE SET compatibility = excluded.compatibility",
                params![subject, mode.name()],
            )
            .map(|_| ())
            .map_err(|e| SinkError::sqlite("schema mode", e))
        })
        .await
    }

    async fn schema_all(&self) -> Result<Vec<Version>, SinkError> {
        self.blocking(|conn| all_versions(conn, "schema versions")).await
    }

    async fn schema_subjects(&self) -> Result<Vec<Subject>, SinkError> {
        self.blocking(move |conn| {
            let what = "schema subjects";
            let all = all_versions(conn, what)?;
            let mut modes = conn
                .prepare_cached("SELECT subject, compatibility FROM schema_subjects")
                .map_err(|e| SinkError::sqlite(what, e))?;
            let modes: std::collections::HashMap<String, String> = modes
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .and_then(Iterator::collect::<Result<_, _>>)
                .map_err(|e| SinkError::sqlite(what, e))?;
            Ok(subjects(all, |s| modes.get(s).and_then(|m| m.parse().ok())))
        })
        .await
    }
}

/// Every stored version, by subject then version.
fn all_versions(conn: &rusqlite::Connection, what: &'static str) -> Result<Vec<Version>, SinkError> {
    let mut read = conn
        .prepare_cached("SELECT subject, version, doc FROM schema_versions ORDER BY subject, version")
        .map_err(|e| SinkError::sqlite(what, e))?;
    let rows = read
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?, r.get::<_, String>(2)?)))
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| SinkError::sqlite(what, e))?;
    rows.iter().map(|(s, v, doc)| from_json(&format!("{s} {v}"), doc.as_bytes())).collect()
}
