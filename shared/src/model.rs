//! Model parameters as they travel: a file split into content-defined chunks (FastCDC, 512 KiB
//! on average, so a fine-tune that rewrites a few layers touches a few chunks and the rest are
//! shared with the version before), each named by its SHA-256; a manifest listing
//! them in order; and the manifest's ed25519 signature by the fleet's model key.
//!
//! What an edge may trust: only a manifest whose signature checks against the public key in
//! its own config, and only chunks whose bytes hash to the name the manifest gives them. Both
//! checks live here so the cloud (before it stores) and the edge (before it stages) run the
//! same code.

use std::io::Read;

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

/// Each changed region costs about itself plus the chunk on either side of its edges: with
/// 1 MiB chunks a 5 % change in three places of a 64 MiB file cost 19.5 % of it in one run,
/// with 512 KiB chunks 11.2 % (`scripts/bench-model-delta.sh`).
pub(crate) const CHUNK_MIN: u32 = 128 << 10;
pub(crate) const CHUNK_AVG: u32 = 512 << 10;
pub const CHUNK_MAX: u32 = 2 << 20;
/// Chunks per manifest, at most: 64 Ki chunks of up to 2 MiB is far beyond any model an edge
/// holds, and bounds what a manifest can make a receiver allocate.
pub(crate) const MAX_CHUNKS: usize = 1 << 16;
/// Encoded manifest bytes, at most.
pub(crate) const MAX_MANIFEST_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("reading the model: {0}")]
    Io(#[from] std::io::Error),
    #[error("manifest of {name} {version}: the signature does not check against key {key_id}")]
    BadSignature { name: String, version: String, key_id: String },
    #[error("manifest signed by key {signed_by}, not by the fleet's key {expected}")]
    OtherKey { signed_by: String, expected: String },
    #[error("manifest unreadable (truncated or not a manifest): {0}")]
    Malformed(String),
    #[error("manifest invalid: {0}")]
    Invalid(String),
    #[error("signing key: {0}")]
    Key(String),
    #[error("chunk {index} should hash to {expected}, its bytes hash to {actual}")]
    ChunkHash { index: usize, expected: String, actual: String },
}

/// One chunk: its SHA-256 (hex) and length.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkRef {
    pub hash: String,
    pub size: u64,
}

/// A model version: what the signature covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub version: String,
    pub size: u64,
    pub chunks: Vec<ChunkRef>,
    pub created_ms: u64,
}

impl Manifest {
    /// Names usable as path components, chunk names that are SHA-256s, sizes that add up.
    pub fn check(&self) -> Result<(), ModelError> {
        valid_name("name", &self.name)?;
        valid_name("version", &self.version)?;
        if self.chunks.len() > MAX_CHUNKS {
            return Err(ModelError::Invalid(format!("{} chunks, more than {MAX_CHUNKS}", self.chunks.len())));
        }
        let mut total = 0u64;
        for (i, c) in self.chunks.iter().enumerate() {
            if c.hash.len() != 64 || !c.hash.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
                return Err(ModelError::Invalid(format!("chunk {i}: {:?} is not a SHA-256 in hex", c.hash)));
            }
            if c.size == 0 || c.size > u64::from(CHUNK_MAX) {
                return Err(ModelError::Invalid(format!("chunk {i}: size {} outside 1..={CHUNK_MAX}", c.size)));
            }
            total += c.size;
        }
        if total != self.size {
            return Err(ModelError::Invalid(format!(
                "chunks add up to {total} bytes, the manifest says {}",
                self.size
            )));
        }
        Ok(())
    }
}

/// Subjects name files on both sides: the characters of a model name.
pub fn valid_subject(subject: &str) -> Result<(), String> {
    valid_name("subject", &schema_model(subject)).map_err(|e| e.to_string())
}

/// The model a schema subject's versions are delivered as: `schema.<subject>`. Every build
/// knows these names, also one without schema validation (`shared`'s `schema` feature).
pub fn schema_model(subject: &str) -> String {
    format!("{SCHEMA_PREFIX}{subject}")
}

/// Model names that carry schemas; `cloud-bridge model publish` refuses them.
pub const SCHEMA_PREFIX: &str = "schema.";

/// Names and versions become path components on both sides: letters, digits, `.`, `_`, `-`,
/// at most 128, starting with a letter or digit. Beside an edge's versions of a model lie
/// their `<version>.manifest` files, the `current` link, `~newest` and temporary files
/// (`.tmp*`, `.current.tmp`), and beside its models the chunk `cache`: none of these is a name
/// or version, so a version can never overwrite another's manifest or the link.
pub fn valid_name(what: &str, s: &str) -> Result<(), ModelError> {
    let ok = s.len() <= 128
        && s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(ModelError::Invalid(format!(
            "{what} {s:?}: use letters, digits, '.', '_', '-' (at most 128, starting with a letter or digit)"
        )));
    }
    if RESERVED_NAMES.contains(&s) || s.ends_with(".manifest") {
        return Err(ModelError::Invalid(format!(
            "{what} {s:?}: reserved (the edge keeps {} and <version>.manifest files beside its models)",
            RESERVED_NAMES.join(", ")
        )));
    }
    Ok(())
}

/// Files an edge keeps beside its models and versions (`valid_name`).
const RESERVED_NAMES: [&str; 2] = ["current", "cache"];

/// A manifest as signed: its CBOR bytes, the signature over them, the signer's key id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedManifest {
    #[serde(with = "serde_bytes")]
    pub manifest: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
    pub key_id: String,
}

impl SignedManifest {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(self, &mut out).expect("writing to a Vec cannot fail");
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ModelError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(ModelError::Malformed(format!("{} bytes, more than {MAX_MANIFEST_BYTES}", bytes.len())));
        }
        ciborium::from_reader(bytes).map_err(|e| ModelError::Malformed(e.to_string()))
    }

    /// The manifest without checking the signature: for a store listing what it signed itself,
    /// never for deciding what to run.
    pub fn unverified(&self) -> Result<Manifest, ModelError> {
        ciborium::from_reader(self.manifest.as_slice()).map_err(|e| ModelError::Malformed(e.to_string()))
    }

    /// The manifest, if the signature checks against `public_key` and the manifest is sound.
    pub fn verify(&self, public_key: &[u8]) -> Result<Manifest, ModelError> {
        let expected = key_id(public_key);
        if self.key_id != expected {
            return Err(ModelError::OtherKey { signed_by: self.key_id.clone(), expected });
        }
        let manifest: Manifest =
            ciborium::from_reader(self.manifest.as_slice()).map_err(|e| ModelError::Malformed(e.to_string()))?;
        UnparsedPublicKey::new(&ED25519, public_key).verify(&self.manifest, &self.signature).map_err(|_| {
            ModelError::BadSignature {
                name: manifest.name.clone(),
                version: manifest.version.clone(),
                key_id: expected,
            }
        })?;
        manifest.check()?;
        Ok(manifest)
    }
}

/// A key's id: the first 8 bytes of the SHA-256 of its public key, in hex.
pub fn key_id(public_key: &[u8]) -> String {
    hex(&ring::digest::digest(&ring::digest::SHA256, public_key).as_ref()[..8])
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes`, in hex: a chunk's name.
pub fn chunk_hash(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// Checks that chunk `index` of a manifest has the bytes it names.
pub fn verify_chunk(index: usize, expected: &ChunkRef, bytes: &[u8]) -> Result<(), ModelError> {
    let actual = chunk_hash(bytes);
    if actual != expected.hash || bytes.len() as u64 != expected.size {
        return Err(ModelError::ChunkHash { index, expected: expected.hash.clone(), actual });
    }
    Ok(())
}

/// Splits what `reader` yields into content-defined chunks, handing each to `each` with its
/// reference; returns the references in order.
pub fn chunk<R: Read, E>(
    reader: R,
    mut each: impl FnMut(&ChunkRef, &[u8]) -> Result<(), E>,
) -> Result<Vec<ChunkRef>, ChunkError<E>> {
    let mut refs = Vec::new();
    for c in fastcdc::v2020::StreamCDC::new(reader, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX) {
        let c = c.map_err(|e| ChunkError::Read(std::io::Error::other(e.to_string())))?;
        let r = ChunkRef { hash: chunk_hash(&c.data), size: c.data.len() as u64 };
        each(&r, &c.data).map_err(ChunkError::Sink)?;
        refs.push(r);
    }
    Ok(refs)
}

/// Either side of chunking failed: the file read, or the caller's `each` (two cases a caller
/// tells apart, so it is exhaustive).
#[derive(Debug, thiserror::Error)]
pub enum ChunkError<E> {
    #[error("reading the model: {0}")]
    Read(std::io::Error),
    #[error(transparent)]
    Sink(E),
}

/// The fleet's model signing key (ed25519; PKCS#8 on disk).
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").field("key_id", &key_id(self.public_key())).finish()
    }
}

impl SigningKey {
    /// A new key, as PKCS#8 bytes to store.
    pub fn generate() -> Result<Vec<u8>, ModelError> {
        let rng = ring::rand::SystemRandom::new();
        Ed25519KeyPair::generate_pkcs8(&rng).map(|d| d.as_ref().to_vec()).map_err(|e| ModelError::Key(e.to_string()))
    }

    pub fn from_pkcs8(der: &[u8]) -> Result<Self, ModelError> {
        Ed25519KeyPair::from_pkcs8(der)
            .map(|pair| Self { pair })
            .map_err(|e| ModelError::Key(format!("not an ed25519 PKCS#8 key: {e}")))
    }

    pub fn public_key(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    pub fn sign(&self, manifest: &Manifest) -> SignedManifest {
        let mut bytes = Vec::new();
        ciborium::into_writer(manifest, &mut bytes).expect("writing to a Vec cannot fail");
        let signature = self.pair.sign(&bytes).as_ref().to_vec();
        SignedManifest { manifest: bytes, signature, key_id: key_id(self.public_key()) }
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
