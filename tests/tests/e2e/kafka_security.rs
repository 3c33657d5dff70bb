//! The Kafka sink against brokers that want to know who it is, as managed Kafka does:
//! SASL/SCRAM-SHA-512 with a user made on the brokers, and mutual TLS with certificates of a
//! test CA. The right credentials write and read marks; wrong ones are refused at connect with
//! the brokers' reason.

use std::time::Duration;

use cloud_bridge::sink::kafka::KafkaSink;
use cloud_bridge::sink::kafka::settings::{KafkaSasl, KafkaSettings, KafkaTls};
use cloud_bridge::sink::{RecordSink, SinkError};
use e2e_tests::certs::Ca;
use e2e_tests::fixtures::wire_record;
use e2e_tests::kafka::{KafkaBroker, Security};
use shared::proto::{Lane, LaneSeq, Seq};
use shared::units::HumanDuration;

/// A batch written and its mark read back by a second sink (its own consumer of the marks).
async fn writes_and_reads_back(settings: &KafkaSettings) {
    let sink = KafkaSink::connect(settings).await.expect("connect with the right credentials");
    sink.admit_epoch("edge-s", "ep").await.unwrap();
    let records = (1..=3).map(|s| wire_record(s, "secure/x", format!("{s}"))).collect();
    sink.write("edge-s", "ep", 0, records, 3).await.unwrap();
    let again = KafkaSink::connect(settings).await.expect("connect again");
    assert_eq!(again.committed("edge-s", "ep").await.unwrap(), [LaneSeq { lane: Lane(0), seq: Seq(3) }]);
}

/// Connecting with `settings` fails within a short startup retry; the error's text.
async fn refused(mut settings: KafkaSettings) -> String {
    settings.startup_retry = HumanDuration(Duration::from_secs(3));
    match KafkaSink::connect(&settings).await {
        Ok(_) => panic!("connected with wrong credentials"),
        Err(e @ (SinkError::Unavailable { .. } | SinkError::Kafka { .. })) => e.to_string(),
        Err(e) => panic!("not a connection failure: {e}"),
    }
}

/// [issue 44] SASL/SCRAM-SHA-512: the user made on the brokers writes; a wrong password is
/// refused, and the error says authentication failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_credentials_write_and_a_wrong_password_is_refused() {
    let broker = KafkaBroker::start_with(1, Security::Scram { user: "bridge".into(), password: "s3cret-pw".into() });
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("kafka-password");
    std::fs::write(&password_file, "s3cret-pw\n").unwrap();
    let mut settings = KafkaSettings::new(&broker.bootstrap());
    settings.sasl = Some(KafkaSasl {
        mechanism: "SCRAM-SHA-512".into(),
        username: "bridge".into(),
        password: None,
        password_file: Some(password_file),
    });
    writes_and_reads_back(&settings).await;

    let mut wrong = settings.clone();
    wrong.sasl =
        Some(KafkaSasl { password: Some("guess".into()), password_file: None, ..settings.sasl.clone().unwrap() });
    let why = refused(wrong).await;
    assert!(why.contains("SASL authentication error"), "the brokers' reason is quoted: {why}");
    let mut none = settings.clone();
    none.sasl = None;
    refused(none).await;
}

/// [issue 44] Mutual TLS: the bridge's certificate from the CA the brokers trust writes; a
/// bridge without one, or with one of another CA, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_writes_and_a_bridge_without_the_cas_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "kafka");
    let server = ca.server(dir.path(), "broker");
    let client = ca.client(dir.path(), "bridge-1");
    let broker = KafkaBroker::start_with(
        1,
        Security::MutualTls { cert: server.cert.clone(), key: server.key.clone(), ca: ca.cert_path.clone() },
    );
    let mut settings = KafkaSettings::new(&broker.bootstrap());
    settings.tls = Some(KafkaTls {
        ca: Some(ca.cert_path.clone()),
        cert: Some(client.cert.clone()),
        key: Some(client.key.clone()),
    });
    writes_and_reads_back(&settings).await;

    let mut anonymous = settings.clone();
    anonymous.tls = Some(KafkaTls { ca: Some(ca.cert_path.clone()), cert: None, key: None });
    let why = refused(anonymous).await;
    assert!(why.contains("bad certificate"), "the broker's TLS alert is quoted: {why}");
    let other = Ca::new(dir.path(), "other");
    let stranger = other.client(dir.path(), "bridge-2");
    let mut foreign = settings.clone();
    foreign.tls = Some(KafkaTls { ca: Some(ca.cert_path.clone()), cert: Some(stranger.cert), key: Some(stranger.key) });
    let why = refused(foreign).await;
    assert!(why.contains("bad certificate"), "{why}");
}
