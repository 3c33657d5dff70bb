//! Tells local apps which model versions are current: a retained QoS1 message per model on
//! `<prefix>/<name>/current` (JSON: name, version, path, sha256, size), published through the
//! node's own broker as an in-process client. The broker keeps retained messages only in
//! memory, so the node announces every model it holds at start, and again after each staging.

use super::Current;
use crate::client::{ClientError, Connector};

/// Publishes on behalf of the model syncer.
#[derive(Debug, Clone)]
pub(crate) struct Announcer {
    pub connector: Connector,
    pub prefix: String,
    pub node_id: String,
}

impl Announcer {
    /// Publishes `currents` retained on `<prefix>/<name>/current` and waits for their PUBACKs.
    pub(crate) async fn announce(&self, currents: &[Current]) -> Result<(), ClientError> {
        if currents.is_empty() {
            return Ok(());
        }
        let mut client = self
            .connector
            .connect(&format!("{}models-{}", crate::broker::core::INTERNAL_CLIENT_ID_PREFIX, self.node_id))
            .await?;
        for c in currents {
            let topic = format!("{}/{}/current", self.prefix, c.name);
            let payload = serde_json::to_vec(c).map_err(|e| ClientError::Codec(e.to_string()))?;
            client.publish_acked(&topic, &payload, true).await?;
            tracing::info!(model = c.name, version = c.version, topic, "model announced");
        }
        client.disconnect().await
    }
}
