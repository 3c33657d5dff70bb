//! An edge's epochs in the marks topic (`e/<edge>`), admitted within its quota through the
//! edge's own producer ([`super::lanes::Lanes::owned_write`]): the bridge serving the edge is
//! the one writer of its epochs, as compare-and-set makes it in the other sinks. Retiring an
//! epoch deletes its marks in the same transaction.

use shared::units::now_ms;

use super::KafkaSink;
use super::lanes::tombstone;
use super::names::partition_of;
use super::outgoing::Outgoing;
use crate::sink::SinkError;
use crate::sink::quota::{EpochVerdict, Epochs};

pub(crate) async fn admit(sink: &KafkaSink, edge: &str, epoch: &str) -> Result<EpochVerdict, SinkError> {
    let id = sink.settings.edge_id(edge);
    let (marks, topic) = (&*sink.marks, &sink.marks_topic);
    sink.lanes
        .owned_write(&id, &[marks], || {
            let key = super::epochs_key(edge);
            let mut epochs: Epochs = match marks.get(&key) {
                Some(v) => serde_json::from_slice(&v).map_err(|e| SinkError::corrupt("read epochs", &key, e))?,
                None => Epochs::default(),
            };
            let verdict = epochs.admit(epoch, now_ms(), &sink.quota);
            let EpochVerdict::Added { retired } = &verdict else { return Ok((Vec::new(), verdict)) };
            let mut writes = vec![Outgoing {
                seq: 0,
                topic: topic.name.clone(),
                partition: partition_of(&key, topic.partitions),
                key: key.clone().into_bytes(),
                headers: Vec::new(),
                payload: serde_json::to_vec(&epochs).map_err(|e| SinkError::invalid("epochs", e))?,
                tombstone: false,
            }];
            for old in retired {
                let prefix = super::mark_key(edge, old, 0);
                for (mark, _) in marks.scan(&prefix[..prefix.len() - 1]) {
                    writes.push(tombstone(topic, mark));
                }
            }
            Ok((writes, verdict))
        })
        .await
        .inspect(|verdict| {
            if let EpochVerdict::Added { retired } = verdict {
                for old in retired {
                    let prefix = super::mark_key(edge, old, 0);
                    sink.lanes.forget(&prefix[..prefix.len() - 1]);
                }
            }
        })
}
