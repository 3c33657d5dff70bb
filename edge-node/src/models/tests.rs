use std::collections::HashSet;

use shared::model::{ChunkRef, Manifest, SigningKey};
use shared::testing::noise;

use super::*;

struct Fleet {
    key: SigningKey,
}

impl Fleet {
    fn new() -> Self {
        Self { key: SigningKey::from_pkcs8(&SigningKey::generate().unwrap()).unwrap() }
    }

    /// A signed manifest of `data`, and its chunks.
    fn publish(&self, version: &str, data: &[u8], created_ms: u64) -> (SignedManifest, Vec<(ChunkRef, Vec<u8>)>) {
        self.publish_as("yolo", version, data, created_ms)
    }

    fn publish_as(
        &self,
        name: &str,
        version: &str,
        data: &[u8],
        created_ms: u64,
    ) -> (SignedManifest, Vec<(ChunkRef, Vec<u8>)>) {
        let mut chunks = Vec::new();
        shared::model::chunk::<_, std::convert::Infallible>(data, |r, b| {
            chunks.push((r.clone(), b.to_vec()));
            Ok(())
        })
        .unwrap();
        let m = Manifest {
            name: name.into(),
            version: version.into(),
            size: data.len() as u64,
            chunks: chunks.iter().map(|(r, _)| r.clone()).collect(),
            created_ms,
        };
        (self.key.sign(&m), chunks)
    }
}

fn fill(cache: &ChunkCache, chunks: &[(ChunkRef, Vec<u8>)]) {
    for (i, (r, b)) in chunks.iter().enumerate() {
        cache.put(i, r, b).unwrap();
    }
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".tmp"))
        .collect()
}

#[test]
fn a_staged_version_is_byte_identical_current_and_hashed() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::new();
    let models = Models::open(dir.path(), fleet.key.public_key().to_vec(), 3).unwrap();
    let cache = models.cache().unwrap();
    let data = noise(3 << 20, 1);
    let (signed, chunks) = fleet.publish("1", &data, 1);
    let m = models.verify(&signed).unwrap();
    assert_eq!(cache.missing(&m).len(), chunks.len());
    fill(&cache, &chunks);
    assert!(cache.missing(&m).is_empty());
    let current = models.stage(&signed, &cache).unwrap();
    assert_eq!(std::fs::read(&current.path).unwrap(), data);
    assert_eq!(current.sha256, shared::model::chunk_hash(&data));
    assert_eq!(models.current("yolo").unwrap(), Some(current));
    assert_eq!(models.names(), ["yolo"]);
}

#[test]
fn failures_while_staging_leave_the_previous_version_current_and_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::new();
    let models = Models::open(dir.path(), fleet.key.public_key().to_vec(), 3).unwrap();
    let cache = models.cache().unwrap();
    let (v1, c1) = fleet.publish("1", &noise(2 << 20, 1), 1);
    fill(&cache, &c1);
    let before = models.stage(&v1, &cache).unwrap();
    let model_dir = dir.path().join("yolo");

    // A chunk never fetched.
    let (v2, c2) = fleet.publish("2", &noise(2 << 20, 2), 2);
    fill(&cache, &c2[1..]);
    let e = models.stage(&v2, &cache).unwrap_err();
    assert!(matches!(e, StageError::MissingChunk { index: 0, .. }), "{e}");
    // A cached chunk gone bad on disk: refused, dropped from the cache to be fetched again.
    cache.put(0, &c2[0].0, &c2[0].1).unwrap();
    let bad = cache.path(&c2[1].0.hash);
    let mut bytes = std::fs::read(&bad).unwrap();
    bytes[7] ^= 1;
    std::fs::write(&bad, bytes).unwrap();
    let e = models.stage(&v2, &cache).unwrap_err();
    assert!(e.to_string().contains("chunk 1 should hash to"), "{e}");
    assert!(!cache.has(&c2[1].0));
    // The disk fills up half way.
    cache.put(1, &c2[1].0, &c2[1].1).unwrap();
    let mut written = 0usize;
    let e = models
        .stage_through(&v2, &cache, |f, b| {
            written += b.len();
            if written > 1 << 20 {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            f.write_all(b)
        })
        .unwrap_err();
    assert!(e.to_string().contains("No space left on device"), "{e}");
    // A manifest signed by another key, or truncated.
    let other = Fleet::new();
    let (forged, _) = other.publish("3", &noise(1 << 20, 3), 3);
    assert!(matches!(models.stage(&forged, &cache).unwrap_err(), StageError::Model(ModelError::OtherKey { .. })));
    let truncated = v2.to_bytes();
    assert!(SignedManifest::from_bytes(&truncated[..truncated.len() - 9]).is_err());

    assert_eq!(models.current("yolo").unwrap(), Some(before), "the previous version stays current");
    assert!(!model_dir.join("2").exists() && !model_dir.join("3").exists());
    assert!(leftovers(&model_dir).is_empty(), "{:?}", leftovers(&model_dir));
    // With everything in place the same manifest stages.
    assert_eq!(models.stage(&v2, &cache).unwrap().version, "2");
}

#[test]
fn old_versions_are_pruned_and_rollback_steps_back() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::new();
    let models = Models::open(dir.path(), fleet.key.public_key().to_vec(), 2).unwrap();
    let cache = models.cache().unwrap();
    for v in 1..=3u64 {
        let (signed, chunks) = fleet.publish(&v.to_string(), &noise(1 << 20, v), v);
        fill(&cache, &chunks);
        models.stage(&signed, &cache).unwrap();
    }
    let versions: Vec<String> = models.versions("yolo").into_iter().map(|m| m.version).collect();
    assert_eq!(versions, ["2", "3"], "keep = 2");
    assert_eq!(models.rollback("yolo").unwrap().version, "2");
    assert_eq!(models.current("yolo").unwrap().unwrap().version, "2");
    assert!(matches!(models.rollback("yolo").unwrap_err(), StageError::NothingToRollBack(_)));
    assert!(matches!(models.rollback("nope").unwrap_err(), StageError::NoModel(_)));
}

#[test]
fn the_cache_refuses_bad_bytes_and_trims_to_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path()).unwrap();
    let chunks: Vec<(ChunkRef, Vec<u8>)> = (0..4)
        .map(|i| {
            let b = noise(1000, 10 + i);
            (ChunkRef { hash: shared::model::chunk_hash(&b), size: 1000 }, b)
        })
        .collect();
    let e = cache.put(0, &chunks[0].0, &chunks[1].1).unwrap_err();
    assert!(e.to_string().contains("chunk 0 should hash to"), "{e}");
    fill(&cache, &chunks);
    assert_eq!(cache.bytes(), 4000);
    let keep: HashSet<String> = [chunks[0].0.hash.clone()].into();
    assert_eq!(cache.trim(1500, &keep), 3000);
    assert!(cache.has(&chunks[0].0) && !cache.has(&chunks[1].0));
}

/// An edge refused an older version only while it still held a newer one: once the newer file
/// was pruned or deleted, a replayed older signed manifest was staged (a downgrade). The newest
/// ever staged is kept beside the versions, across pruning, deletion and restarts.
#[test]
fn a_replayed_older_manifest_is_refused_after_the_newer_file_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::new();
    let models = Models::open(dir.path(), fleet.key.public_key().to_vec(), 3).unwrap();
    let cache = models.cache().unwrap();
    let (old, old_chunks) = fleet.publish("1", &noise(64 << 10, 1), 1_000);
    let (new, new_chunks) = fleet.publish("2", &noise(64 << 10, 2), 2_000);
    fill(&cache, &old_chunks);
    fill(&cache, &new_chunks);
    let old_m = models.verify(&old).unwrap();
    assert_eq!(models.admits(&old_m), Ok(()));
    models.stage(&new, &cache).unwrap();
    assert_eq!(models.admits(&models.verify(&new).unwrap()), Err(Refusal::Staged));
    // The newer version's files go (an operator's cleanup, a damaged disk).
    std::fs::remove_file(dir.path().join("yolo/2")).unwrap();
    std::fs::remove_file(dir.path().join("yolo/2.manifest")).unwrap();
    let reopened = Models::open(dir.path(), fleet.key.public_key().to_vec(), 3).unwrap();
    assert_eq!(reopened.admits(&old_m), Err(Refusal::Older { newest_ms: 2_000 }));
    let (newer, _) = fleet.publish("3", &noise(64 << 10, 3), 3_000);
    assert_eq!(reopened.admits(&reopened.verify(&newer).unwrap()), Ok(()));
}

/// Issue 45: a schema version the registry delivered again later (its first delivery failed)
/// was created after a newer one, and made the edge validate with the older. A schema's
/// versions are ordered by their numbers.
#[test]
fn a_schema_version_below_the_staged_one_is_refused_however_late_it_was_made() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::new();
    let models = Models::open(dir.path(), fleet.key.public_key().to_vec(), 3).unwrap();
    let cache = models.cache().unwrap();
    let (five, five_chunks) = fleet.publish_as("schema.t", "5", b"{}", 1_000);
    let (four, _) = fleet.publish_as("schema.t", "4", b"{}", 2_000);
    fill(&cache, &five_chunks);
    models.stage(&five, &cache).unwrap();
    assert_eq!(models.admits(&models.verify(&four).unwrap()), Err(Refusal::Lower { highest: 5 }));
    let (six, _) = fleet.publish_as("schema.t", "6", b"{}", 1_500);
    assert_eq!(models.admits(&models.verify(&six).unwrap()), Ok(()), "a higher number is newer, whenever made");
    // Other models keep their order by creation time.
    let (late, _) = fleet.publish_as("yolo", "1", b"{}", 2_000);
    assert_eq!(models.admits(&models.verify(&late).unwrap()), Ok(()));
}
