//! The password file: `user:$argon2id$...` lines, as `edge-node passwd` writes them. Only
//! hashes are stored; verification runs argon2 off the async runtime (it takes tens of
//! milliseconds by design).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::rand_core::RngCore;
use argon2::password_hash::{PasswordHash, PasswordHasher, SaltString};
use argon2::{Argon2, Block};

use super::AuthError;

#[derive(Debug, Default)]
pub struct PasswordFile {
    hashes: BTreeMap<String, String>,
    /// SHA-256 of (stored hash, password) of each user's last good login. A reconnect storm
    /// then costs one argon2 run per user, not one per connection. Dropped with the file on
    /// reload, so a changed password is never served from it.
    verified: Mutex<HashMap<String, [u8; 32]>>,
}

impl PasswordFile {
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read { path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    pub(super) fn parse(text: &str, path: &Path) -> Result<Self, AuthError> {
        let mut hashes = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: String| AuthError::PasswordLine { path: path.to_owned(), line: i + 1, reason };
            let (user, hash) = line.split_once(':').ok_or_else(|| bad("expected user:hash".into()))?;
            check_user_name(user).map_err(|e| bad(e.to_string()))?;
            PasswordHash::new(hash)
                .map_err(|e| bad(format!("not a password hash ({e}); use `edge-node passwd` to write entries")))?;
            if hashes.insert(user.to_owned(), hash.to_owned()).is_some() {
                return Err(bad(format!("user {user:?} appears twice")));
            }
        }
        Ok(Self { hashes, verified: Mutex::default() })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether the file has an entry for `user`.
    pub(crate) fn has_user(&self, user: &str) -> bool {
        self.hashes.contains_key(user)
    }

    /// Whether `password` is what `user` logged in with last time (no argon2 run).
    pub(crate) fn verified_before(&self, user: &str, password: &[u8]) -> bool {
        let Some(stored) = self.hashes.get(user) else { return false };
        self.verified.lock().is_ok_and(|v| v.get(user) == Some(&login_digest(stored, password)))
    }

    /// Checks a password, blocking for one argon2 run in `memory` (grown to what the hash's
    /// parameters need, then reused by the caller's next check). An unknown user is checked
    /// against a decoy hash of the default parameters, so it costs what a known one costs and
    /// its absence does not show in the time taken.
    pub(crate) fn verify_with(&self, user: &str, password: &[u8], memory: &mut Vec<Block>) -> bool {
        if self.verified_before(user, password) {
            return true;
        }
        let (stored, known) = match self.hashes.get(user) {
            Some(stored) => (stored.as_str(), true),
            None => (decoy_hash(), false),
        };
        let ok = argon2_matches(stored, password, memory) && known;
        if ok && let Ok(mut verified) = self.verified.lock() {
            verified.insert(user.to_owned(), login_digest(stored, password));
        }
        ok
    }

    #[cfg(test)]
    fn verify(&self, user: &str, password: &[u8]) -> bool {
        self.verify_with(user, password, &mut Vec::new())
    }

    /// Adds or replaces `user` in the file at `path` (created if missing, mode 0600), writing a
    /// temporary file and renaming it so a crash never leaves a half-written file.
    pub fn set_password(path: &Path, user: &str, password: &[u8]) -> Result<(), AuthError> {
        check_user_name(user)?;
        let mut file = match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::default(),
            Err(source) => return Err(AuthError::Read { path: path.to_owned(), source }),
        };
        file.hashes.insert(user.to_owned(), hash_password(password)?);
        let mut text = String::from("# edge-node password file: user:argon2 hash. Edit with `edge-node passwd`.\n");
        for (u, h) in &file.hashes {
            text.push_str(&format!("{u}:{h}\n"));
        }
        write_private_atomically(path, text.as_bytes())
    }
}

/// A hash of a random password with the default parameters, made once: what unknown users are
/// checked against.
fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| {
        let mut password = [0u8; 32];
        OsRng.fill_bytes(&mut password);
        hash_password(&password).unwrap_or_default()
    })
}

/// Whether `password` hashes to `stored` (a PHC string), computed in `memory`: argon2's own
/// `verify_password` allocates its 19 MiB afresh per call, which the allocator then keeps per
/// thread.
fn argon2_matches(stored: &str, password: &[u8], memory: &mut Vec<Block>) -> bool {
    let Ok(hash) = PasswordHash::new(stored) else { return false };
    let (Some(expected), Some(salt)) = (hash.hash, hash.salt) else { return false };
    let Ok(algorithm) = argon2::Algorithm::try_from(hash.algorithm) else { return false };
    let Ok(params) = argon2::Params::try_from(&hash) else { return false };
    let version = hash.version.and_then(|v| argon2::Version::try_from(v).ok()).unwrap_or_default();
    let mut salt_bytes = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_bytes) else { return false };
    if memory.len() < params.block_count() {
        memory.resize(params.block_count(), Block::default());
    }
    let mut out = vec![0u8; expected.len()];
    let argon = Argon2::new(algorithm, version, params);
    if argon.hash_password_into_with_memory(password, salt, &mut out, &mut memory[..]).is_err() {
        return false;
    }
    // `Output`'s equality is constant-time.
    argon2::password_hash::Output::new(&out).is_ok_and(|o| o == expected)
}

fn login_digest(stored: &str, password: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(stored.as_bytes());
    ctx.update(&[0]);
    ctx.update(password);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

pub fn hash_password(password: &[u8]) -> Result<String, AuthError> {
    Argon2::default()
        .hash_password(password, &SaltString::generate(&mut OsRng))
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

fn check_user_name(user: &str) -> Result<(), AuthError> {
    if user.is_empty() || user.contains(':') || user.contains(char::is_whitespace) {
        return Err(AuthError::BadUserName(user.to_owned()));
    }
    Ok(())
}

fn write_private_atomically(path: &Path, bytes: &[u8]) -> Result<(), AuthError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| AuthError::Write { path: path.to_owned(), source };
    let mut tmp = PathBuf::from(path);
    tmp.as_mut_os_string().push(".tmp");
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_then_verify() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passwd");
        PasswordFile::set_password(&path, "alice", b"s3cret").unwrap();
        PasswordFile::set_password(&path, "bob", b"other").unwrap();
        PasswordFile::set_password(&path, "alice", b"changed").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("changed") && text.contains("$argon2id$"), "{text}");
        let file = PasswordFile::load(&path).unwrap();
        assert_eq!(file.len(), 2);
        assert!(file.verify("alice", b"changed"));
        // Second time from the cache; a wrong password must still fail after a good one.
        assert!(file.verify("alice", b"changed"));
        assert!(!file.verify("alice", b"s3cret"));
        assert!(file.verify("bob", b"other"));
        assert!(!file.verify("carol", b"other"));
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        let err = PasswordFile::parse("# c\nalice:plaintext\n", Path::new("pw")).unwrap_err().to_string();
        assert!(err.starts_with("pw, line 2: not a password hash"), "{err}");
        assert!(PasswordFile::set_password(Path::new("/nonexistent/x"), "a b", b"x").is_err());
    }
}
