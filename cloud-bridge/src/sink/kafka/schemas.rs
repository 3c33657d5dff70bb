//! The schema registry in Kafka: the compacted topic `sink.schemas_topic` (default
//! `edge-schemas`), keys `v/<subject>/<version>` (the version as JSON) and `m/<subject>` (the
//! mode). A version number is taken by create-if-absent through the subject's own producer
//! (`<prefix>.schemas.<subject>`): two registrations racing for it are serialized by fencing, so
//! they cannot both win.

use shared::schema::{Compatibility, Version};

use super::KafkaSink;
use crate::sink::SinkError;
use crate::sink::schemas::{SchemaStore, Subject, from_json, parse_mode, sorted, subjects, to_json};

const VERSION: &str = "v/";
const MODE: &str = "m/";

fn version_key(subject: &str, version: u32) -> String {
    format!("{VERSION}{subject}/{version}")
}

impl KafkaSink {
    /// Every version and mode stored (the registry is small: subjects times versions).
    async fn all_schemas(&self) -> Result<(Vec<Version>, Vec<(String, Compatibility)>), SinkError> {
        self.schemas.read_to_end().await?;
        let versions =
            self.schemas.scan(VERSION).into_iter().map(|(k, v)| from_json(&k, &v)).collect::<Result<Vec<_>, _>>()?;
        let mut modes = Vec::new();
        for (key, value) in self.schemas.scan(MODE) {
            let mode = parse_mode(&key, &String::from_utf8_lossy(&value))?;
            modes.push((key[MODE.len()..].to_owned(), mode));
        }
        Ok((versions, modes))
    }
}

impl SchemaStore for KafkaSink {
    async fn schema_versions(&self, subject: &str) -> Result<Vec<Version>, SinkError> {
        let (versions, _) = self.all_schemas().await?;
        let mut out: Vec<Version> = versions.into_iter().filter(|v| v.subject == subject).collect();
        out.sort_by_key(|v| v.version);
        Ok(out)
    }

    async fn schema_put(&self, v: &Version) -> Result<bool, SinkError> {
        let key = version_key(&v.subject, v.version);
        let value = to_json(v)?.into_bytes();
        let (log, topic) = (&*self.schemas, &self.schemas_topic);
        let id = format!("{}.schemas.{}", self.settings.transactional_id_prefix, v.subject);
        super::txn::exclusive_write(&self.settings, &id, &[log], || {
            if log.get(&key).is_some() {
                return Ok((Vec::new(), false));
            }
            Ok((vec![topic.put(key.clone(), value)], true))
        })
        .await
    }

    async fn schema_mode(&self, subject: &str) -> Result<Option<Compatibility>, SinkError> {
        self.schemas.read_to_end().await?;
        let key = format!("{MODE}{subject}");
        self.schemas.get(&key).map(|v| parse_mode(&key, &String::from_utf8_lossy(&v))).transpose()
    }

    async fn schema_set_mode(&self, subject: &str, mode: Compatibility) -> Result<(), SinkError> {
        let key = format!("{MODE}{subject}");
        self.plain.put(&self.schemas_topic, &key, mode.name().as_bytes()).await?;
        // The command that set it reads it back next.
        self.schemas.await_shows(&key, Some(mode.name().as_bytes()), self.settings.transaction_timeout.0).await
    }

    async fn schema_all(&self) -> Result<Vec<Version>, SinkError> {
        Ok(sorted(self.all_schemas().await?.0))
    }

    async fn schema_subjects(&self) -> Result<Vec<Subject>, SinkError> {
        let (versions, modes) = self.all_schemas().await?;
        Ok(subjects(versions, |s| modes.iter().find(|(m, _)| m == s).map(|(_, c)| *c)))
    }
}
