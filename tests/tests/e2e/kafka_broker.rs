//! The Kafka the sink's tests will run against (issue 44): Apache Kafka 4.x from Maven Central,
//! started in KRaft mode by the test support code, answers its own admin tool. If the install
//! script's fetch or the fixture breaks, this says so before any sink test does.

use e2e_tests::kafka::KafkaBroker;

#[test]
fn a_kraft_broker_from_maven_central_starts_and_takes_a_topic() {
    let broker = KafkaBroker::start();
    let created = broker.topics(&["--create", "--topic", "edge.telemetry", "--partitions", "3"]);
    let text = |o: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    };
    assert!(created.status.success(), "create: {}\nbroker log:\n{}", text(&created), broker.log());
    let described = broker.topics(&["--describe", "--topic", "edge.telemetry"]);
    let out = String::from_utf8_lossy(&described.stdout);
    assert!(out.contains("PartitionCount: 3"), "{out}");
    assert_eq!(out.lines().filter(|l| l.contains("Leader: 1")).count(), 3, "{out}");
}
