//! `[models]`: where model versions are kept and the key that signs their manifests.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[models]`: where model versions are kept and the key that signs their manifests.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// `dir` (default: a directory) or `jetstream` (an object store bucket).
    #[serde(default)]
    pub store: ModelStoreKind,
    /// The directory store: content-addressed chunks and signed manifests. Default: `models`.
    #[serde(default = "default_models_dir")]
    pub dir: PathBuf,
    /// The JetStream store's bucket. Default: `edge-models`.
    #[serde(default = "default_models_bucket")]
    pub bucket: String,
    /// The JetStream store's server. Default: the jetstream sink's.
    pub url: Option<String>,
    /// The bucket's replicas when it is created. Default: 1.
    #[serde(default = "default_models_replicas")]
    pub replicas: usize,
    /// The fleet's ed25519 model signing key, PKCS#8 (`cloud-bridge model keygen`). Edges hold
    /// its public half.
    pub signing_key: PathBuf,
    /// How often connected edges' models are checked for a newer version. Default: 2s.
    #[serde(default = "default_models_poll")]
    pub poll: shared::units::HumanDuration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelStoreKind {
    #[default]
    Dir,
    Jetstream,
}

impl ModelStoreKind {
    /// As in the config.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ModelStoreKind::Dir => "dir",
            ModelStoreKind::Jetstream => "jetstream",
        }
    }
}

fn default_models_dir() -> PathBuf {
    PathBuf::from("models")
}
fn default_models_bucket() -> String {
    "edge-models".into()
}
fn default_models_replicas() -> usize {
    1
}

fn default_models_poll() -> shared::units::HumanDuration {
    shared::units::HumanDuration(std::time::Duration::from_secs(2))
}
