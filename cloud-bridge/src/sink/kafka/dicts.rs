//! The edges' compression dictionaries in Kafka: the bytes in the compacted dictionaries topic
//! (`<edge>/<id>`), each edge's index (`di/<edge>`) in the state topic, both written in one
//! transaction by the bridge holding the edge's claim, within the edge's quota; an evicted dictionary is
//! deleted in the same transaction. The bytes are not held in memory by every bridge: the
//! dictionaries log keeps where each is, and a hello reads those it needs.

use shared::proto::DictAnnounce;
use shared::units::now_ms;

use super::KafkaSink;
use crate::sink::quota::DictIndex;
use crate::sink::{DictStore, SinkError};

/// Dictionary ids are hex digests; anything else an edge names is not looked up.
fn is_dict_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

fn dict_key(edge: &str, id: &str) -> String {
    format!("{edge}/{id}")
}

fn index_key(edge: &str) -> String {
    format!("di/{edge}")
}

impl DictStore for KafkaSink {
    async fn load_dicts(&self, edge: &str, ids: &[String]) -> Result<Vec<(String, Vec<u8>)>, SinkError> {
        self.dicts.read_to_end().await?;
        let mut found = Vec::new();
        for id in ids.iter().filter(|id| is_dict_id(id)) {
            if let Some(bytes) = self.dicts.fetch(&dict_key(edge, id)).await? {
                found.push((id.clone(), bytes));
            }
        }
        Ok(found)
    }

    async fn store_dict(&self, edge: &str, dict: &DictAnnounce) -> Result<(), SinkError> {
        if !is_dict_id(&dict.id) {
            return Err(SinkError::invalid("store dict", format!("{:?} is not a dictionary id", dict.id)));
        }
        let (state, dicts) = (&*self.state, &*self.dicts);
        let (state_topic, dicts_topic) = (&self.state_topic, &self.dicts_topic);
        let evicted = self
            .pool
            .owned_write(edge, &[state, dicts], || {
                let key = index_key(edge);
                let mut index: DictIndex = match state.get(&key) {
                    Some(v) => serde_json::from_slice(&v).map_err(|e| SinkError::corrupt("read dicts", &key, e))?,
                    None => DictIndex::default(),
                };
                let evicted = index.add(&dict.id, dict.bytes.len() as u64, now_ms(), &self.quota);
                let index = serde_json::to_vec(&index).map_err(|e| SinkError::invalid("dict index", e))?;
                let mut writes =
                    vec![state_topic.put(key, index), dicts_topic.put(dict_key(edge, &dict.id), dict.bytes.clone())];
                writes.extend(evicted.iter().map(|id| dicts_topic.tombstone(dict_key(edge, id))));
                Ok((writes, evicted))
            })
            .await?;
        for id in evicted {
            self.metrics.dicts_evicted.inc();
            tracing::info!(edge, id, "dictionary evicted: past the edge's dictionary quota");
        }
        Ok(())
    }
}
