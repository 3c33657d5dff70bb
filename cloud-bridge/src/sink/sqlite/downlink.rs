//! The downlink in the SQLite sink: a `downlink` table of messages, one row per edge, read by
//! `(edge_id, seq)`; `downlink_edges`, each edge's position, counts and the last seq handed out
//! for it; `downlink_dead`, what edges refused or let expire, copied from the message row with
//! its payload. Rows at or below an edge's position are deleted when it moves, so what an edge
//! has in `downlink` is its backlog.
//!
//! Each edge has a seq space of its own: a message's `seq` is one past the edge's last one (or
//! its position, if further), so nothing one edge does or claims moves another's. A file put
//! back from an older copy is behind the positions its edges hold: an edge's hello records its
//! own position, and its next message goes past it. `id`, an AUTOINCREMENT row id, keeps the
//! order messages were stored in, across edges, for the news sessions wake on.
//!
//! Files before this layout (schema 1) had one seq for all edges, the row id itself: opened,
//! they are rebuilt in one transaction, every message keeping its seq, and every edge's next
//! seq starting past what the old counter had handed out (`downlink_meta.floor`).

use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use shared::proto::MAX_SEQ;
use shared::units::now_ms;

use super::SqliteSink;
use crate::sink::downlink::{
    Backlog, DOWN_HEADERS, DownBounds, DownDeadLetter, DownDone, DownLimit, DownState, DownSummary, DownlinkStore,
    Enqueued, EnqueuedMany, Outgoing, Pending, ReadLimit, Reply, SEND_IDS,
};
use crate::sink::error::SinkError;
use crate::sink::retry::Retry;

/// How often `down_news` looks for new rows while it waits.
const NEWS_POLL: Duration = Duration::from_millis(25);

/// The message columns but topic and payload, as JSON.
fn message_json(msg: &Outgoing) -> String {
    let rest = Outgoing { topic: String::new(), payload: Vec::new(), ..msg.clone() };
    serde_json::to_string(&rest).unwrap_or_default()
}

fn backlog(conn: &Connection, edge: &str) -> Result<Backlog, SinkError> {
    conn.query_row(
        "SELECT count(*), coalesce(sum(bytes), 0), min(stored_ms) FROM downlink \
         WHERE edge_id = ?1 AND seq > coalesce((SELECT position FROM downlink_edges WHERE edge_id = ?1), 0)",
        params![edge],
        |r| Ok(Backlog { messages: r.get(0)?, bytes: r.get(1)?, oldest_ms: r.get(2)? }),
    )
    .map_err(|e| SinkError::sqlite("downlink backlog", e))
}

fn set_aside(conn: &Connection, edge: &str, seq: u64, outcome: &str, reason: &str, at: u64) -> Result<(), SinkError> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO downlink_dead (edge_id, seq, topic, outcome, reason, payload, message, bytes, at_ms) \
         SELECT edge_id, seq, topic, ?3, ?4, payload, message, bytes, ?5 FROM downlink WHERE edge_id = ?1 AND seq = ?2",
    )
    .and_then(|mut s| s.execute(params![edge, seq, outcome, reason, at]))
    .map(|_| ())
    .map_err(|e| SinkError::sqlite("downlink dead letter", e))
}

/// The seq `edge`'s next message takes: past its last one and its position, and past what the
/// shared counter of schema 1 handed out; past [`MAX_SEQ`] the edge has used its seqs up.
fn next_seq(conn: &Connection, edge: &str) -> Result<u64, SinkError> {
    let what = "downlink seq";
    let floor: u64 = conn
        .query_row("SELECT value FROM downlink_meta WHERE key = 'floor'", [], |r| r.get(0))
        .optional()
        .map_err(|e| SinkError::sqlite(what, e))?
        .unwrap_or(0);
    let (last, position): (u64, u64) = conn
        .query_row("SELECT last_seq, position FROM downlink_edges WHERE edge_id = ?1", params![edge], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(|e| SinkError::sqlite(what, e))?
        .unwrap_or((0, 0));
    let next = floor.max(last).max(position) + 1;
    if next > MAX_SEQ {
        return Err(SinkError::invalid(
            what,
            format!("edge {edge} has used its downlink seqs up (the next would be {next})"),
        ));
    }
    Ok(next)
}

/// The seq a send with `id` stored for `edge` within [`SEND_IDS`], if one did.
fn sent_id(conn: &Connection, edge: &str, id: &str) -> Result<Option<u64>, SinkError> {
    let since = now_ms().saturating_sub(SEND_IDS.1.as_millis() as u64);
    conn.query_row(
        "SELECT seq FROM downlink_ids WHERE edge_id = ?1 AND id = ?2 AND stored_ms >= ?3",
        params![edge, id, since],
        |r| r.get(0),
    )
    .optional()
    .map_err(|e| SinkError::sqlite("downlink send id", e))
}

/// Remembers that a send with `id` stored `seq` for `edge`, and forgets what is past
/// [`SEND_IDS`] (its age, or its count for the edge).
fn keep_id(conn: &Connection, edge: &str, id: &str, seq: u64) -> Result<(), SinkError> {
    let what = "downlink send id";
    let now = now_ms();
    conn.execute(
        "INSERT OR REPLACE INTO downlink_ids (edge_id, id, seq, stored_ms) VALUES (?1, ?2, ?3, ?4)",
        params![edge, id, seq, now],
    )
    .map_err(|e| SinkError::sqlite(what, e))?;
    conn.execute(
        "DELETE FROM downlink_ids WHERE edge_id = ?1 AND (stored_ms < ?2 OR id NOT IN \
         (SELECT id FROM downlink_ids WHERE edge_id = ?1 ORDER BY stored_ms DESC, seq DESC LIMIT ?3))",
        params![edge, now.saturating_sub(SEND_IDS.1.as_millis() as u64), SEND_IDS.0 as i64],
    )
    .map_err(|e| SinkError::sqlite(what, e))?;
    Ok(())
}

/// How many messages of a batch one transaction stores: the writer's lock is held no longer
/// than a few milliseconds for the bridge's own writes.
const BATCH: usize = 500;

/// Stores `msgs` for `edge` in one transaction, each within `bounds` and in order (the rest
/// refused once one is).
fn store(conn: &mut Connection, edge: &str, msgs: &[Outgoing], bounds: DownBounds) -> Result<Vec<Enqueued>, SinkError> {
    let what = "downlink enqueue";
    let tx =
        conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| SinkError::sqlite("begin", e))?;
    let mut waiting = backlog(&tx, edge)?;
    let mut out = Vec::with_capacity(msgs.len());
    for msg in msgs {
        if let Some(Enqueued::Full(b)) = out.last() {
            out.push(Enqueued::Full(*b));
            continue;
        }
        if let Some(seq) = msg.id.as_deref().map(|id| sent_id(&tx, edge, id)).transpose()?.flatten() {
            out.push(Enqueued::Already { seq });
            continue;
        }
        let bytes = msg.bytes();
        if waiting.messages + 1 > bounds.messages || waiting.bytes + bytes > bounds.bytes {
            out.push(Enqueued::Full(waiting));
            continue;
        }
        let seq = next_seq(&tx, edge)?;
        let now = now_ms();
        tx.prepare_cached(
            "INSERT INTO downlink (edge_id, seq, topic, payload, message, bytes, stored_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .and_then(|mut i| i.execute(params![edge, seq, msg.topic, msg.payload, message_json(msg), bytes, now]))
        .map_err(|e| SinkError::sqlite(what, e))?;
        tx.prepare_cached(
            "INSERT INTO downlink_edges (edge_id, position, delivered, refused, expired, last_seq) \
             VALUES (?1, 0, 0, 0, 0, ?2) ON CONFLICT (edge_id) DO UPDATE SET last_seq = excluded.last_seq",
        )
        .and_then(|mut u| u.execute(params![edge, seq]))
        .map_err(|e| SinkError::sqlite(what, e))?;
        if let Some(id) = &msg.id {
            keep_id(&tx, edge, id, seq)?;
        }
        waiting.messages += 1;
        waiting.bytes += bytes;
        waiting.oldest_ms.get_or_insert(now);
        out.push(Enqueued::Stored { seq });
    }
    tx.commit().map_err(|e| SinkError::sqlite("commit", e))?;
    Ok(out)
}

fn record(conn: &mut Connection, edge: &str, done: &DownDone) -> Result<(), SinkError> {
    if done.up_to > MAX_SEQ {
        return Err(SinkError::invalid(
            "downlink position",
            format!("{} is past the highest seq there is", done.up_to),
        ));
    }
    let tx =
        conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(|e| SinkError::sqlite("begin", e))?;
    let now = now_ms();
    for r in &done.refused {
        set_aside(&tx, edge, r.seq, "refused", &r.reason, now)?;
    }
    for seq in &done.expired {
        set_aside(&tx, edge, *seq, "expired", "its expiry ran out before the edge could deliver it", now)?;
    }
    let c = done.counts;
    tx.execute(
        "INSERT INTO downlink_edges (edge_id, position, delivered, refused, expired) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (edge_id) DO UPDATE SET position = excluded.position, \
         delivered = delivered + excluded.delivered, refused = refused + excluded.refused, \
         expired = expired + excluded.expired WHERE excluded.position > position",
        params![edge, done.up_to, c.delivered, c.refused, c.expired],
    )
    .map_err(|e| SinkError::sqlite("downlink position", e))?;
    tx.execute("DELETE FROM downlink WHERE edge_id = ?1 AND seq <= ?2", params![edge, done.up_to])
        .map_err(|e| SinkError::sqlite("downlink delete", e))?;
    tx.commit().map_err(|e| SinkError::sqlite("commit", e))
}

/// Every edge's position, counts and backlog, in one pass over each table.
pub(in crate::sink) fn summary(conn: &Connection) -> Result<Vec<DownSummary>, SinkError> {
    let what = "downlink summary";
    let mut read = conn
        .prepare_cached(
            "WITH edges AS (SELECT edge_id FROM downlink_edges UNION SELECT DISTINCT edge_id FROM downlink) \
             SELECT e.edge_id, coalesce(p.position, 0), coalesce(p.delivered, 0), coalesce(p.refused, 0), \
             coalesce(p.expired, 0), count(m.seq), coalesce(sum(m.bytes), 0), min(m.stored_ms) \
             FROM edges e LEFT JOIN downlink_edges p ON p.edge_id = e.edge_id \
             LEFT JOIN downlink m ON m.edge_id = e.edge_id AND m.seq > coalesce(p.position, 0) \
             GROUP BY e.edge_id ORDER BY e.edge_id",
        )
        .map_err(|e| SinkError::sqlite(what, e))?;
    read.query_map([], |r| {
        Ok(DownSummary {
            edge: r.get(0)?,
            state: DownState { position: r.get(1)?, delivered: r.get(2)?, refused: r.get(3)?, expired: r.get(4)? },
            waiting: r.get(5)?,
            waiting_bytes: Some(r.get(6)?),
            oldest_ms: r.get(7)?,
        })
    })
    .and_then(Iterator::collect)
    .map_err(|e| SinkError::sqlite(what, e))
}

fn pending(r: &rusqlite::Row<'_>) -> rusqlite::Result<(u64, u64, String, Vec<u8>, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

impl SqliteSink {
    /// `f` on the connection, retried with backoff while it fails for the moment.
    async fn retried<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl Fn(&mut Connection) -> Result<T, SinkError> + Send + Sync + Clone + 'static,
    ) -> Result<T, SinkError> {
        let mut retry = Retry::default();
        loop {
            match self.blocking(f.clone()).await {
                Err(e @ SinkError::Sqlite { code, .. }) if is_transient(code) => {
                    retry.wait(what, &e, &self.metrics).await
                }
                other => return other,
            }
        }
    }
}

/// Busy, locked, full, I/O: the file's moment, not the call's fault.
fn is_transient(code: i32) -> bool {
    matches!(code & 0xff, 5 | 6 | 10 | 13)
}

impl DownlinkStore for SqliteSink {
    fn down_limit(&self) -> DownLimit {
        // A row holds what a downlink frame holds.
        DownLimit {
            bytes: shared::proto::down::MAX_DOWN_BYTES as u64 + DOWN_HEADERS,
            of: "a downlink frame's limit",
            reach: None,
        }
    }

    async fn enqueue_many(&self, edge: &str, msgs: &[Outgoing], bounds: DownBounds) -> EnqueuedMany {
        EnqueuedMany::in_chunks(msgs, BATCH, |chunk| {
            let (edge, chunk) = (edge.to_owned(), chunk.to_vec());
            async move {
                match self.retried("downlink enqueue", move |conn| store(conn, &edge, &chunk, bounds)).await {
                    Ok(done) => EnqueuedMany { done, error: None },
                    Err(e) => EnqueuedMany { done: Vec::new(), error: Some(e) },
                }
            }
        })
        .await
    }

    async fn down_trim(&self, _edge: &str, _bounds: DownBounds, _max: usize) -> Result<u64, SinkError> {
        // `send` is the only writer, and checks the bound in the transaction that stores.
        Ok(0)
    }

    async fn down_state(&self, edge: &str) -> Result<DownState, SinkError> {
        let edge = edge.to_owned();
        self.retried("downlink position", move |conn| {
            conn.query_row(
                "SELECT position, delivered, refused, expired FROM downlink_edges WHERE edge_id = ?1",
                params![edge],
                |r| Ok(DownState { position: r.get(0)?, delivered: r.get(1)?, refused: r.get(2)?, expired: r.get(3)? }),
            )
            .optional()
            .map(Option::unwrap_or_default)
            .map_err(|e| SinkError::sqlite("downlink position", e))
        })
        .await
    }

    async fn down_read(&self, edge: &str, after: u64, max: ReadLimit) -> Result<Vec<Pending>, SinkError> {
        let edge = edge.to_owned();
        self.retried("downlink read", move |conn| {
            let mut read = conn
                .prepare_cached(
                    "SELECT seq, stored_ms, topic, payload, message FROM downlink \
                     WHERE edge_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
                )
                .map_err(|e| SinkError::sqlite("downlink read", e))?;
            let rows = read
                .query_map(params![edge, after, max.messages as u64], pending)
                .map_err(|e| SinkError::sqlite("downlink read", e))?;
            // Rows come one at a time: those past the byte budget are never loaded.
            let (mut out, mut bytes) = (Vec::new(), 0);
            for row in rows {
                let (seq, stored_ms, topic, payload, message) =
                    row.map_err(|e| SinkError::sqlite("downlink read", e))?;
                let rest: Outgoing = serde_json::from_str(&message)
                    .map_err(|e| SinkError::corrupt("downlink read", format!("message {seq}"), e))?;
                let msg = Outgoing { topic, payload, ..rest };
                bytes += msg.bytes();
                out.push(Pending { seq, stored_ms, msg, invalid: None });
                if max.reached(out.len(), bytes) {
                    break;
                }
            }
            Ok(out)
        })
        .await
    }

    async fn down_record(&self, edge: &str, done: &DownDone) -> Result<(), SinkError> {
        let (edge, done) = (edge.to_owned(), done.clone());
        self.retried("downlink record", move |conn| record(conn, &edge, &done)).await
    }

    async fn down_set_aside(&self, edge: &str, seq: u64, outcome: &'static str, reason: &str) -> Result<(), SinkError> {
        let (edge, reason) = (edge.to_owned(), reason.to_owned());
        self.retried("downlink dead letter", move |conn| set_aside(conn, &edge, seq, outcome, &reason, now_ms())).await
    }

    async fn down_backlog(&self, edge: &str) -> Result<Backlog, SinkError> {
        let edge = edge.to_owned();
        self.retried("downlink backlog", move |conn| backlog(conn, &edge)).await
    }

    async fn down_dead_letters(&self, edge: Option<&str>, limit: usize) -> Result<Vec<DownDeadLetter>, SinkError> {
        let edge = edge.map(str::to_owned);
        self.retried("downlink dead letters", move |conn| {
            let mut read = conn
                .prepare_cached(
                    "SELECT * FROM (SELECT edge_id, seq, topic, outcome, reason, at_ms, bytes FROM downlink_dead \
                     WHERE ?1 IS NULL OR edge_id = ?1 ORDER BY at_ms DESC, seq DESC LIMIT ?2) ORDER BY at_ms, seq",
                )
                .map_err(|e| SinkError::sqlite("downlink dead letters", e))?;
            read.query_map(params![edge, limit as u64], |r| {
                Ok(DownDeadLetter {
                    edge: r.get(0)?,
                    seq: r.get(1)?,
                    topic: r.get(2)?,
                    outcome: r.get(3)?,
                    reason: r.get(4)?,
                    at_ms: r.get(5)?,
                    bytes: r.get(6)?,
                })
            })
            .and_then(Iterator::collect)
            .map_err(|e| SinkError::sqlite("downlink dead letters", e))
        })
        .await
    }

    async fn down_summary(&self) -> Result<Vec<DownSummary>, SinkError> {
        self.retried("downlink summary", |conn| summary(conn)).await
    }

    async fn reply_cursor(&self) -> Result<u64, SinkError> {
        self.retried("reply cursor", |conn| {
            conn.query_row("SELECT coalesce(max(rowid), 0) FROM records", [], |r| r.get(0))
                .map_err(|e| SinkError::sqlite("reply cursor", e))
        })
        .await
    }

    async fn find_reply(
        &self,
        edge: &str,
        topic: &str,
        correlation: &[u8],
        cursor: u64,
    ) -> Result<Option<Reply>, SinkError> {
        let (edge, topic, want) = (edge.to_owned(), topic.to_owned(), crate::names::correlation_header(correlation));
        self.retried("find reply", move |conn| {
            // Only rows after the cursor: the rowid range, not the table.
            let mut read = conn
                .prepare_cached(
                    "SELECT payload, headers FROM records WHERE rowid > ?1 AND edge_id = ?2 AND topic = ?3 ORDER BY rowid",
                )
                .map_err(|e| SinkError::sqlite("find reply", e))?;
            let rows = read
                .query_map(params![cursor, edge, topic], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Option<String>>(1)?)))
                .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                .map_err(|e| SinkError::sqlite("find reply", e))?;
            for (payload, headers) in rows {
                let headers: Vec<(String, String)> = headers.and_then(|h| serde_json::from_str(&h).ok()).unwrap_or_default();
                if headers.iter().any(|(k, v)| k == "Mqtt-Correlation-Data" && *v == want) {
                    return Ok(Some(Reply { payload, headers }));
                }
            }
            Ok(None)
        })
        .await
    }

    async fn down_news(&self, cursor: Option<u64>, wait: Duration) -> Result<(u64, Vec<String>), SinkError> {
        let Some(cursor) = cursor else {
            return self
                .retried("downlink news", |conn| {
                    conn.query_row("SELECT coalesce(max(id), 0) FROM downlink", [], |r| r.get(0))
                        .map_err(|e| SinkError::sqlite("downlink news", e))
                })
                .await
                .map(|head| (head, Vec::new()));
        };
        let deadline = Instant::now() + wait;
        loop {
            let news = self
                .retried("downlink news", move |conn| {
                    let mut read = conn
                        .prepare_cached("SELECT id, edge_id FROM downlink WHERE id > ?1 ORDER BY id LIMIT 4096")
                        .map_err(|e| SinkError::sqlite("downlink news", e))?;
                    read.query_map([cursor], |r| Ok((r.get::<_, u64>(0)?, r.get::<_, String>(1)?)))
                        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                        .map_err(|e| SinkError::sqlite("downlink news", e))
                })
                .await?;
            if let Some(&(head, _)) = news.last() {
                let mut edges: Vec<String> = news.into_iter().map(|(_, e)| e).collect();
                edges.sort();
                edges.dedup();
                return Ok((head, edges));
            }
            if Instant::now() >= deadline {
                return Ok((cursor, Vec::new()));
            }
            tokio::time::sleep(NEWS_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(topic: &str) -> Outgoing {
        Outgoing { topic: topic.into(), payload: b"x".to_vec(), qos: 1, ..Outgoing::default() }
    }

    const BOUNDS: DownBounds = DownBounds { messages: 100, bytes: 1 << 20 };

    async fn stored(sink: &SqliteSink, edge: &str) -> Result<u64, SinkError> {
        match sink.enqueue(edge, &msg("cmd/x"), BOUNDS).await? {
            Enqueued::Stored { seq } => Ok(seq),
            other => panic!("not stored: {other:?}"),
        }
    }

    /// Each edge has a seq space of its own: one edge's position, however far its hello
    /// claims it is, moves no other edge's seqs (one edge's `i64::MAX` once left every send
    /// to every edge failing for good); a position past the highest seq is refused, and an edge
    /// that used its seqs up has its own sends refused, not retried.
    #[tokio::test]
    async fn one_edges_position_moves_no_other_edges_seqs() {
        let dir = tempfile::tempdir().unwrap();
        let sink = SqliteSink::open(&dir.path().join("sink.db")).unwrap();
        assert_eq!(stored(&sink, "a").await.unwrap(), 1);
        assert_eq!(stored(&sink, "b").await.unwrap(), 1);
        sink.down_record("b", &DownDone { up_to: MAX_SEQ - 1, ..Default::default() }).await.unwrap();
        assert_eq!(stored(&sink, "a").await.unwrap(), 2, "b's position is b's");
        assert_eq!(stored(&sink, "b").await.unwrap(), MAX_SEQ, "b's next goes past its position");
        let err = stored(&sink, "b").await.unwrap_err();
        assert!(
            matches!(err, SinkError::Invalid { .. }) && err.to_string().contains("used its downlink seqs up"),
            "{err}"
        );
        for claim in [MAX_SEQ + 1, i64::MAX as u64] {
            let err = sink.down_record("a", &DownDone { up_to: claim, ..Default::default() }).await.unwrap_err();
            assert!(matches!(err, SinkError::Invalid { .. }), "{claim}: {err}");
        }
        assert_eq!(stored(&sink, "c").await.unwrap(), 1);
        let read = sink.down_read("a", 0, ReadLimit::messages(10)).await.unwrap();
        assert_eq!(read.iter().map(|p| p.seq).collect::<Vec<_>>(), [1, 2]);
    }

    /// A file of the layout with one seq for every edge is rebuilt at open: each message keeps
    /// its seq, positions stand, and every edge's next message goes past all the old counter
    /// handed out, so no edge sees a seq it passed.
    #[tokio::test]
    async fn a_file_with_one_seq_for_all_edges_is_rebuilt_keeping_its_seqs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sink.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE downlink (seq INTEGER PRIMARY KEY AUTOINCREMENT, edge_id TEXT NOT NULL, \
                 topic TEXT NOT NULL, payload BLOB NOT NULL, message TEXT NOT NULL, bytes INTEGER NOT NULL, \
                 stored_ms INTEGER NOT NULL);
                 CREATE INDEX downlink_by_edge ON downlink (edge_id, seq);
                 CREATE TABLE downlink_edges (edge_id TEXT PRIMARY KEY, position INTEGER NOT NULL, \
                 delivered INTEGER NOT NULL, refused INTEGER NOT NULL, expired INTEGER NOT NULL);
                 INSERT INTO downlink_edges VALUES ('a', 3, 3, 0, 0);",
            )
            .unwrap();
            let json = message_json(&msg("cmd/x"));
            for (seq, edge) in [(5, "a"), (9, "b")] {
                conn.execute(
                    "INSERT INTO downlink VALUES (?1, ?2, 'cmd/x', X'78', ?3, 1, 0)",
                    params![seq, edge, json],
                )
                .unwrap();
            }
        }
        let sink = SqliteSink::open(&path).unwrap();
        let read = sink.down_read("a", 3, ReadLimit::messages(10)).await.unwrap();
        assert_eq!((read.len(), read[0].seq, read[0].msg.topic.as_str()), (1, 5, "cmd/x"));
        assert_eq!(sink.down_state("a").await.unwrap().position, 3);
        assert_eq!(stored(&sink, "a").await.unwrap(), 10);
        assert_eq!(stored(&sink, "new").await.unwrap(), 10);
        let (_, edges) = sink.down_news(Some(0), Duration::ZERO).await.unwrap();
        assert_eq!(edges, ["a", "b", "new"]);
        drop(sink);
        // Opened again: nothing to rebuild; each edge goes on in its own space.
        let sink = SqliteSink::open(&path).unwrap();
        assert_eq!(stored(&sink, "a").await.unwrap(), 11);
        assert_eq!(stored(&sink, "b").await.unwrap(), 10);
    }
}
