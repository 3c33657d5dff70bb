//! `cloud-bridge certs init`: a development fleet PKI. A fleet CA, a server certificate for the
//! bridge, and one client certificate per edge whose DNS name is the edge's id. Production
//! fleets use their own CA; these files only make the demo and the tests real mutual TLS.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

#[derive(Debug, thiserror::Error)]
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

/// Writes `fleet-ca.pem`, `cloud.pem`/`cloud.key` (for `server_names`, plus localhost and
/// 127.0.0.1) and `edge-<id>.pem`/`.key` for each edge into `dir`.
pub fn init(dir: &Path, server_names: &[String], edges: &[String], force: bool) -> Result<Pki, CertError> {
    std::fs::create_dir_all(dir).map_err(|source| CertError::Write { path: dir.to_owned(), source })?;
    let ca_path = dir.join("fleet-ca.pem");
    if ca_path.exists() && !force {
        return Err(CertError::Exists(ca_path));
    }
    for id in edges {
        let ok = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        if !ok {
            return Err(CertError::BadEdgeId(id.clone()));
        }
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "edge fleet development CA");
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca = ca_params.self_signed(&ca_key)?;
    write(&ca_path, &ca.pem())?;

    let mut names = server_names.to_vec();
    names.push("localhost".into());
    let mut params = CertificateParams::new(names)?;
    params.subject_alt_names.push(SanType::IpAddress(IpAddr::from([127, 0, 0, 1])));
    params.distinguished_name.push(DnType::CommonName, "cloud-bridge");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let (server_cert, server_key) = issue(dir, "cloud", params, &ca, &ca_key)?;

    let mut issued = Vec::new();
    for id in edges {
        let mut params = CertificateParams::new(vec![id.clone()])?;
        params.distinguished_name.push(DnType::CommonName, id.as_str());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let (cert, key) = issue(dir, &format!("edge-{id}"), params, &ca, &ca_key)?;
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
    write(&key_path, &key.serialize_pem())?;
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
}
