//! `[models]`: which models this edge follows and where it stages them, and its own check.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use shared::units::ByteSize;

use shared::check::Problems;

/// `[models]`: which models to follow, where to stage them, and the key their manifests must
/// be signed with.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// Staged versions, `current` links and the chunk cache. Default: `models`.
    #[serde(default = "default_models_dir")]
    pub dir: PathBuf,
    /// The fleet's model signing public key (`cloud-bridge model keygen` writes it).
    pub public_key: PathBuf,
    /// Model names to follow; sent to the bridge in the hello.
    #[serde(default)]
    pub follow: Vec<String>,
    /// Versions kept per model, the current one included. Default: 3.
    #[serde(default = "default_keep")]
    pub keep: usize,
    /// Chunks fetched at once, each on its own QUIC stream. Default: 8.
    #[serde(default = "default_models_parallel")]
    pub parallel: usize,
    /// Chunk cache bound. Default: 2 GiB.
    #[serde(default = "default_cache_budget")]
    pub cache_budget: ByteSize,
    /// Local apps learn a model's current version from the retained message on
    /// `<topic_prefix>/<name>/current`. Default: `models`.
    #[serde(default = "default_models_topic")]
    pub topic_prefix: String,
}

fn default_models_dir() -> PathBuf {
    PathBuf::from("models")
}
fn default_models_parallel() -> usize {
    8
}
fn default_keep() -> usize {
    3
}
fn default_cache_budget() -> ByteSize {
    ByteSize::mib(2048)
}
fn default_models_topic() -> String {
    "models".into()
}

impl ModelsConfig {
    /// Also reads the public key, which must be an ed25519 key's 32 bytes.
    pub fn check(&self, p: &mut Problems) {
        match std::fs::read(&self.public_key) {
            Ok(k) if k.len() == 32 => {}
            Ok(k) => p.bad(
                "models.public_key",
                format!("{}: {} bytes, an ed25519 public key has 32", self.public_key.display(), k.len()),
            ),
            Err(e) => p.bad("models.public_key", format!("{}: {e}", self.public_key.display())),
        }
        if self.keep == 0 {
            p.bad("models.keep", "must be at least 1");
        }
        if !(1..=64).contains(&self.parallel) {
            p.bad("models.parallel", format!("{} is outside 1..=64", self.parallel));
        }
        for (i, name) in self.follow.iter().enumerate() {
            if let Err(e) = shared::model::valid_name("name", name) {
                p.bad(format!("models.follow[{i}]"), e.to_string());
            }
        }
        if let Err(e) = shared::topic::validate_name(&self.topic_prefix) {
            p.bad("models.topic_prefix", e.to_string());
        }
    }
}
