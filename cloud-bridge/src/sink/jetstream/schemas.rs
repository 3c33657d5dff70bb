//! The registry in the JetStream sink: one KV bucket, `v.<subject>.<version>` and `m.<subject>`.

use bytes::Bytes;
use shared::schema::{Compatibility, Version};

use super::JetStreamSink;
use super::bucket::read_all;
use crate::sink::error::SinkError;
use crate::sink::schemas::{SchemaStore, Subject, from_json, parse_mode, sorted, subjects, to_json};

const VERSION: &str = "v.";
const MODE: &str = "m.";

fn version_key(subject: &str, version: u32) -> String {
    format!("{VERSION}{subject}.{version}")
}

/// Every version in the bucket (the registry is small: subjects times versions).
async fn all(sink: &JetStreamSink) -> Result<(Vec<Version>, Vec<(String, Compatibility)>), SinkError> {
    let (mut versions, mut modes) = (Vec::new(), Vec::new());
    for (key, value) in read_all(sink.schemas(), "read schemas").await? {
        if key.starts_with(VERSION) {
            versions.push(from_json(&key, &value)?);
        } else if let Some(subject) = key.strip_prefix(MODE) {
            let mode = parse_mode(&key, &String::from_utf8_lossy(&value))?;
            modes.push((subject.to_owned(), mode));
        }
    }
    Ok((versions, modes))
}

impl SchemaStore for JetStreamSink {
    async fn schema_versions(&self, subject: &str) -> Result<Vec<Version>, SinkError> {
        let (versions, _) = all(self).await?;
        let mut out: Vec<Version> = versions.into_iter().filter(|v| v.subject == subject).collect();
        out.sort_by_key(|v| v.version);
        Ok(out)
    }

    async fn schema_put(&self, v: &Version) -> Result<bool, SinkError> {
        use async_nats::jetstream::kv::CreateErrorKind;
        let key = version_key(&v.subject, v.version);
        match self.schemas().create(&key, Bytes::from(to_json(v)?)).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(SinkError::nats("store schema", &key, &e)),
        }
    }

    async fn schema_mode(&self, subject: &str) -> Result<Option<Compatibility>, SinkError> {
        let key = format!("{MODE}{subject}");
        match self.schemas().get(&key).await.map_err(|e| SinkError::nats("schema mode", &key, &e))? {
            Some(v) => parse_mode(&key, &String::from_utf8_lossy(&v)).map(Some),
            None => Ok(None),
        }
    }

    async fn schema_set_mode(&self, subject: &str, mode: Compatibility) -> Result<(), SinkError> {
        let key = format!("{MODE}{subject}");
        self.schemas()
            .put(&key, Bytes::from_static(mode.name().as_bytes()))
            .await
            .map(|_| ())
            .map_err(|e| SinkError::nats("schema mode", &key, &e))
    }

    async fn schema_all(&self) -> Result<Vec<Version>, SinkError> {
        Ok(sorted(all(self).await?.0))
    }

    async fn schema_subjects(&self) -> Result<Vec<Subject>, SinkError> {
        let (versions, modes) = all(self).await?;
        Ok(subjects(versions, |s| modes.iter().find(|(m, _)| m == s).map(|(_, c)| *c)))
    }
}
