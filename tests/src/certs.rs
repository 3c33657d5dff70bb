//! A throwaway PKI for tests: a CA, a server certificate for `localhost`/127.0.0.1, and client
//! certificates, written as PEM files.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

pub struct Ca {
    cert: Certificate,
    key: KeyPair,
    pub cert_path: PathBuf,
}

/// A certificate and key written to disk.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).expect("CA cert");
        let cert_path = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert_path, cert.pem()).expect("write CA");
        Ca { cert, key, cert_path }
    }

    fn issue(&self, dir: &Path, file: &str, mut params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("leaf key");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("sign leaf");
        let issued = Issued { cert: dir.join(format!("{file}.pem")), key: dir.join(format!("{file}.key")) };
        std::fs::write(&issued.cert, cert.pem()).expect("write cert");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write key");
        issued
    }

    pub fn server(&self, dir: &Path, file: &str) -> Issued {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("server params");
        params.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, "localhost");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(dir, file, params)
    }

    /// A client certificate named `name` that expires `valid_for` from now.
    pub fn client_until(&self, dir: &Path, name: &str, valid_for: std::time::Duration) -> Issued {
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("client params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
        params.not_after = time::OffsetDateTime::now_utc() + valid_for;
        self.issue(dir, name, params)
    }

    /// A client certificate whose first DNS name is `name`.
    pub fn client(&self, dir: &Path, name: &str) -> Issued {
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("client params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(dir, name, params)
    }
}
