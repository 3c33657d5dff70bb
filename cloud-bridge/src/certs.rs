//! `cloud-bridge certs init`: a development fleet PKI. A fleet CA, a server certificate for the
//! bridge, and one client certificate per edge whose DNS name is the edge's id; `certs
//! add-edge` issues one more edge certificate from the same CA. Private keys are written
//! readable by their owner only (0600), the CA's (`fleet-ca.key`) apart from its certificate.
//! Production fleets use their own CA; these files only make the demo and the tests real
//! mutual TLS.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    #[error("{0} exists; pass --force to replace the whole PKI")]
    Exists(PathBuf),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{0:?} is not a usable edge id (DNS name characters only)")]
    BadEdgeId(String),
    #[error("cannot read the fleet CA's {path} (made by `certs init`): {reason}")]
    Ca { path: PathBuf, reason: String },
    #[error("{0} exists; an edge certificate is issued once (remove it to issue a new one)")]
    EdgeExists(PathBuf),
}

/// What `init` wrote.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// Per edge id: certificate and key.
    pub edges: Vec<(String, PathBuf, PathBuf)>,
}

fn write(path: &Path, text: &str) -> Result<(), CertError> {
    std::fs::write(path, text).map_err(|source| CertError::Write { path: path.to_owned(), source })
}

/// Writes a private key readable by its owner only, whatever the umask and whatever mode a
/// file it replaces had.
fn write_private(path: &Path, text: &str) -> Result<(), CertError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let failed = |source| CertError::Write { path: path.to_owned(), source };
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(failed)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
    f.write_all(text.as_bytes()).map_err(failed)
}

fn check_edge_id(id: &str) -> Result<(), CertError> {
    let ok = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if ok { Ok(()) } else { Err(CertError::BadEdgeId(id.to_owned())) }
}

/// The CA's certificate as `key` signs it: its parameters are fixed, so the same key makes a
/// certificate with the same subject and key, which is all an issued certificate names.
fn ca_certificate(key: &KeyPair) -> Result<Certificate, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "edge fleet development CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok(params.self_signed(key)?)
}

fn issue_edge(dir: &Path, id: &str, ca: &Certificate, ca_key: &KeyPair) -> Result<(PathBuf, PathBuf), CertError> {
    let mut params = CertificateParams::new(vec![id.to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, id);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    issue(dir, &format!("edge-{id}"), params, ca, ca_key)
}

/// Issues `edge-<id>.pem`/`.key` in `dir` from the CA `certs init` made there
/// (`fleet-ca.key`): adding an edge no longer means replacing every certificate.
pub fn add_edge(dir: &Path, id: &str) -> Result<(PathBuf, PathBuf), CertError> {
    check_edge_id(id)?;
    let key_path = dir.join("fleet-ca.key");
    let ca_err = |reason: String| CertError::Ca { path: key_path.clone(), reason };
    let pem = std::fs::read_to_string(&key_path).map_err(|e| ca_err(e.to_string()))?;
    let ca_key = KeyPair::from_pem(&pem).map_err(|e| ca_err(e.to_string()))?;
    let cert_path = dir.join(format!("edge-{id}.pem"));
    if cert_path.exists() {
        return Err(CertError::EdgeExists(cert_path));
    }
    let ca = ca_certificate(&ca_key)?;
    issue_edge(dir, id, &ca, &ca_key)
}

/// Writes `fleet-ca.pem`, `cloud.pem`/`cloud.key` (for `server_names`, plus localhost and
/// 127.0.0.1) and `edge-<id>.pem`/`.key` for each edge into `dir`.
pub fn init(dir: &Path, server_names: &[String], edges: &[String], force: bool) -> Result<Pki, CertError> {
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write { path: dir.to_owned(), source })?;
    let ca_path = dir.join("fleet-ca.pem");
    if ca_path.exists() && !force {
        return Err(CertError::Exists(ca_path));
    }
    for id in edges {
        check_edge_id(id)?;
    }
    let ca_key = KeyPair::generate()?;
    let ca = ca_certificate(&ca_key)?;
    write(&ca_path, &ca.pem())?;
    // Kept, apart and private, so `certs add-edge` can issue more.
    write_private(&dir.join("fleet-ca.key"), &ca_key.serialize_pem())?;

    let mut names = server_names.to_vec();
    names.push("localhost".into());
    let mut params = CertificateParams::new(names)?;
    params.subject_alt_names.push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    params.distinguished_name.push(DnType::CommonName, "cloud-bridge");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let (server_cert, server_key) = issue(dir, "cloud", params, &ca, &ca_key)?;

    let mut issued = Vec::new();
    for id in edges {
        let (cert, key) = issue_edge(dir, id, &ca, &ca_key)?;
        issued.push((id.clone(), cert, key));
    }
    Ok(Pki { ca: ca_path, server_cert, server_key, edges: issued })
}

fn issue(
    dir: &Path,
    name: &str,
    mut params: CertificateParams,
    ca: &Certificate,
    ca_key: &KeyPair,
) -> Result<(PathBuf, PathBuf), CertError> {
    let key = KeyPair::generate()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let mut serial = [0u8; 16];
    rand::Rng::fill(&mut rand::thread_rng(), &mut serial[..]);
    // Positive (top bit clear) and never a leading zero byte, which DER drops: every serial
    // is 16 bytes, 32 hex digits, as deny lists and logs show it. A random first byte of 0
    // (1 in 128) made it 15.
    serial[0] = (serial[0] & 0x7f) | 0x40;
    params.serial_number = Some(serial.to_vec().into());
    let cert = params.signed_by(&key, ca, ca_key)?;
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
    write(&cert_path, &cert.pem())?;
    write_private(&key_path, &key.serialize_pem())?;
    Ok((cert_path, key_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_certificates_name_their_edge_and_a_second_init_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pki = init(dir.path(), &["cloud.example".into()], &["edge-7".into()], false).unwrap();
        let cert = shared::tls::load_certs(&pki.edges[0].1).unwrap();
        assert_eq!(shared::tls::certificate_identity(&cert[0]).as_deref(), Some("edge-7"));
        assert_eq!(shared::tls::certificate_serial(&cert[0]).map(|s| s.len()), Some(32));
        assert!(matches!(init(dir.path(), &[], &[], false), Err(CertError::Exists(_))));
        assert!(matches!(init(dir.path(), &[], &["bad id".into()], true), Err(CertError::BadEdgeId(_))));
    }

    /// Keys were written 0644 and the CA key was not kept, so a second edge meant replacing
    /// every certificate: keys are 0600 now, and `add_edge` issues one more edge certificate
    /// that chains to the CA `init` wrote (checked with rustls's verifier, as the bridge
    /// checks edges).
    #[test]
    fn keys_are_private_and_an_edge_is_added_from_the_kept_ca() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pki = init(dir.path(), &[], &["edge-1".into()], false).unwrap();
        for key in [dir.path().join("fleet-ca.key"), pki.server_key.clone(), pki.edges[0].2.clone()] {
            let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let (cert, key) = add_edge(dir.path(), "edge-2").unwrap();
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        let chain = shared::tls::load_certs(&cert).unwrap();
        assert_eq!(shared::tls::certificate_identity(&chain[0]).as_deref(), Some("edge-2"));
        let mut roots = rustls::RootCertStore::empty();
        for ca in shared::tls::load_certs(&pki.ca).unwrap() {
            roots.add(ca).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(std::sync::Arc::new(roots)).build().unwrap();
        let now = rustls::pki_types::UnixTime::now();
        assert!(verifier.verify_client_cert(&chain[0], &[], now).is_ok(), "edge-2 chains to the fleet CA");
        assert!(matches!(add_edge(dir.path(), "edge-2"), Err(CertError::EdgeExists(_))));
        assert!(matches!(add_edge(dir.path(), "bad id"), Err(CertError::BadEdgeId(_))));
        std::fs::remove_file(dir.path().join("fleet-ca.key")).unwrap();
        assert!(matches!(add_edge(dir.path(), "edge-3"), Err(CertError::Ca { .. })));
    }
}
