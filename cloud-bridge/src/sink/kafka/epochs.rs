//! An edge's epochs in the marks topic (`e/<edge>`), admitted within its quota by the bridge
//! holding the edge's claim ([`super::claims`], [`super::pool::Pool::owned_write`]): the one
//! writer of its epochs, as compare-and-set makes it in the other sinks. A hello claims the
//! edge first. Retiring an epoch deletes its marks in the same transaction.

use shared::units::now_ms;

use super::KafkaSink;
use crate::sink::SinkError;
use crate::sink::quota::{EpochVerdict, Epochs};

pub(crate) async fn admit(sink: &KafkaSink, edge: &str, epoch: &str) -> Result<EpochVerdict, SinkError> {
    let verified = sink.pool.claim(edge).await?;
    let (marks, topic) = (&*sink.marks, &sink.marks_topic);
    sink.pool
        .owned_write(edge, &[marks], || {
            let key = super::epochs_key(edge);
            let mut epochs: Epochs = match marks.get(&key) {
                Some(v) => serde_json::from_slice(&v).map_err(|e| SinkError::corrupt("read epochs", &key, e))?,
                None => Epochs::default(),
            };
            let verdict = epochs.admit(epoch, now_ms(), &sink.quota);
            // A claim just verified is said so with the edge's first write.
            let mut writes: Vec<_> = verified.into_iter().collect();
            let EpochVerdict::Added { retired } = &verdict else { return Ok((writes, verdict)) };
            let value = serde_json::to_vec(&epochs).map_err(|e| SinkError::invalid("epochs", e))?;
            writes.push(topic.put(key, value));
            for old in retired {
                for (mark, _) in marks.scan(&super::marks_prefix(edge, old)) {
                    writes.push(topic.tombstone(mark));
                }
            }
            Ok((writes, verdict))
        })
        .await
        .inspect(|verdict| {
            if let EpochVerdict::Added { retired } = verdict {
                for old in retired {
                    sink.pool.forget(&super::marks_prefix(edge, old));
                }
            }
        })
}
