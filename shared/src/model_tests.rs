use super::*;
use crate::testing::noise;

fn split(data: &[u8]) -> Vec<(ChunkRef, Vec<u8>)> {
    let mut out = Vec::new();
    chunk::<_, std::convert::Infallible>(data, |r, bytes| {
        out.push((r.clone(), bytes.to_vec()));
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn chunks_cover_the_file_in_bounds_and_are_named_by_their_hash() {
    let data = noise(9 << 20, 7);
    let chunks = split(&data);
    let joined: Vec<u8> = chunks.iter().flat_map(|(_, b)| b.clone()).collect();
    assert_eq!(joined, data);
    for (i, (r, bytes)) in chunks.iter().enumerate() {
        assert_eq!(r.size as usize, bytes.len());
        assert!(r.size <= u64::from(CHUNK_MAX));
        assert!(r.size >= u64::from(CHUNK_MIN) || i == chunks.len() - 1, "chunk {i}: {}", r.size);
        verify_chunk(i, r, bytes).unwrap();
    }
    assert_eq!(
        split(&data).into_iter().map(|(r, _)| r).collect::<Vec<_>>(),
        chunks.into_iter().map(|(r, _)| r).collect::<Vec<_>>()
    );
}

#[test]
fn a_five_percent_fine_tune_shares_most_chunks_with_the_version_before() {
    let v1 = noise(64 << 20, 11);
    let mut v2 = v1.clone();
    // About 5 % rewritten in three contiguous regions, as a fine-tune of a few layers does.
    let region = v1.len() / 60;
    for (k, start) in [v1.len() / 10, v1.len() / 2, v1.len() * 9 / 10].into_iter().enumerate() {
        v2[start..start + region].copy_from_slice(&noise(region, 100 + k as u64));
    }
    let old: std::collections::HashSet<String> = split(&v1).into_iter().map(|(r, _)| r.hash).collect();
    let new_bytes: u64 = split(&v2).iter().filter(|(r, _)| !old.contains(&r.hash)).map(|(r, _)| r.size).sum();
    let share = new_bytes as f64 / v2.len() as f64;
    assert!(share <= 0.15, "a 5 % change needs {:.1} % of the file", share * 100.0);
    assert!(share >= 0.05, "at least the changed bytes are new: {:.1} %", share * 100.0);
}

fn manifest(data: &[u8]) -> Manifest {
    let chunks: Vec<ChunkRef> = split(data).into_iter().map(|(r, _)| r).collect();
    Manifest { name: "yolo-edge".into(), version: "3.2.1".into(), size: data.len() as u64, chunks, created_ms: 1 }
}

#[test]
fn only_a_manifest_signed_by_the_fleet_key_and_intact_verifies() {
    let key = SigningKey::from_pkcs8(&SigningKey::generate().unwrap()).unwrap();
    let m = manifest(&noise(3 << 20, 3));
    let signed = key.sign(&m);
    let bytes = signed.to_bytes();
    assert_eq!(SignedManifest::from_bytes(&bytes).unwrap().verify(key.public_key()).unwrap(), m);

    // Another key: named as such.
    let other = SigningKey::from_pkcs8(&SigningKey::generate().unwrap()).unwrap();
    let e = other.sign(&m).verify(key.public_key()).unwrap_err();
    assert!(matches!(e, ModelError::OtherKey { .. }), "{e}");
    // A forged key id on another key's signature: the signature itself fails.
    let mut forged = other.sign(&m);
    forged.key_id = key_id(key.public_key());
    let e = forged.verify(key.public_key()).unwrap_err();
    assert!(e.to_string().contains("signature does not check"), "{e}");
    // A manifest changed after signing.
    let mut tampered = signed.clone();
    let mut changed = m.clone();
    changed.chunks[0].hash = "0".repeat(64);
    ciborium::into_writer(&changed, &mut {
        tampered.manifest.clear();
        &mut tampered.manifest
    })
    .unwrap();
    assert!(matches!(tampered.verify(key.public_key()).unwrap_err(), ModelError::BadSignature { .. }));
    // Truncated on the way.
    let e = SignedManifest::from_bytes(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(e.to_string().contains("manifest unreadable"), "{e}");
}

#[test]
fn unsound_manifests_are_refused_even_when_signed() {
    let key = SigningKey::from_pkcs8(&SigningKey::generate().unwrap()).unwrap();
    let good = manifest(&noise(1 << 20, 5));
    let cases: Vec<(Manifest, &str)> = vec![
        (Manifest { name: "../etc".into(), ..good.clone() }, "name"),
        (Manifest { version: "".into(), ..good.clone() }, "version"),
        (Manifest { size: good.size + 1, ..good.clone() }, "add up"),
        (Manifest { chunks: vec![ChunkRef { hash: "XYZ".into(), size: good.size }], ..good.clone() }, "not a SHA-256"),
    ];
    for (m, expected) in cases {
        let e = key.sign(&m).verify(key.public_key()).unwrap_err();
        assert!(e.to_string().contains(expected), "{expected}: {e}");
    }
    let data = noise(1000, 9);
    let r = ChunkRef { hash: chunk_hash(&data), size: 1000 };
    let mut bad = data.clone();
    bad[10] ^= 1;
    assert!(verify_chunk(4, &r, &bad).unwrap_err().to_string().starts_with("chunk 4 should hash to"));
    assert!(SigningKey::from_pkcs8(b"not a key").unwrap_err().to_string().contains("not an ed25519 PKCS#8 key"));
}

#[test]
fn names_and_versions_cannot_take_the_files_beside_them() {
    for ok in ["yolo-edge", "1", "2.0.1", "v1_rc-2", "current2", "1.manifests"] {
        assert!(valid_name("version", ok).is_ok(), "{ok}");
    }
    for bad in ["", ".", "..", ".tmpA1b2", ".current.tmp", "~newest", "current", "cache", "1.manifest", "a/b", "-x"] {
        let e = valid_name("version", bad).unwrap_err().to_string();
        assert!(e.contains(&format!("version {bad:?}")), "{bad}: {e}");
    }
    assert!(valid_name("version", &"a".repeat(129)).is_err());
    assert!(valid_name("version", "current").unwrap_err().to_string().contains("reserved"));
}
