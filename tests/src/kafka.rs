//! Real Apache Kafka for tests, in KRaft mode (each node a broker and a controller, no
//! ZooKeeper): one node or a cluster of three on free loopback ports, their logs in a temporary
//! directory, killed on drop; a node can be killed (SIGKILL) and started again on its data. Its
//! jars come from Maven Central through scripts/fetch-kafka.sh, which the install script runs
//! once; this asks the same script for the folder, so both agree on where it is.
//!
//! [`Security`] adds a listener clients must authenticate on: SASL/SCRAM-SHA-512 (a user made
//! at format time) or mutual TLS (PEM files the test makes).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a node may take to listen: a JVM's start on two shared cores.
const START: Duration = Duration::from_secs(90);
const CLUSTER_ID: &str = "MkU3OEVBNTcwNTJENDM2Qg";

/// How clients reach the brokers.
#[derive(Debug, Clone, Default)]
pub enum Security {
    #[default]
    Plaintext,
    /// SASL/SCRAM-SHA-512 over plaintext, with this user and password.
    Scram { user: String, password: String },
    /// TLS with client certificates: the brokers' key and certificate and the CA that signs
    /// clients, PEM files.
    MutualTls { cert: PathBuf, key: PathBuf, ca: PathBuf },
}

struct Node {
    child: Option<Child>,
    port: u16,
    properties: PathBuf,
    log: PathBuf,
}

/// One Kafka node, or a cluster of them.
pub struct KafkaBroker {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

/// The folder of Kafka's jars, fetched if it is not yet; asked of the script once per process.
pub fn libs() -> PathBuf {
    static LIBS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIBS.get_or_init(fetched).clone()
}

fn fetched() -> PathBuf {
    let script = crate::workspace_root().join("scripts/fetch-kafka.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; run scripts/install-test-deps.sh", script.display()));
    assert!(out.status.success(), "{} failed; run scripts/install-test-deps.sh", script.display());
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `java` with Kafka's jars on the class path, sized for a test: a small heap, the serial GC.
fn java(libs: &Path) -> Command {
    let mut c = Command::new("java");
    c.args(["-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp"]).arg(libs.join("*"));
    c
}

impl KafkaBroker {
    /// A single node, plaintext, formatted afresh.
    pub fn start() -> KafkaBroker {
        Self::start_with(1, Security::Plaintext)
    }

    /// Three nodes, each a broker and a voter of the controller quorum; internal topics with 3
    /// copies, 2 in sync.
    pub fn cluster() -> KafkaBroker {
        Self::start_with(3, Security::Plaintext)
    }

    /// `count` nodes whose client listener is secured as `security` says.
    pub fn start_with(count: usize, security: Security) -> KafkaBroker {
        let libs = libs();
        let dir = tempfile::tempdir().expect("kafka dir");
        // Each free when asked, but the kernel may hand the same one out twice in a row: the
        // listeners of a node (and of the cluster) must differ.
        let mut taken = std::collections::BTreeSet::new();
        let mut distinct = || loop {
            let port = crate::free_port();
            if taken.insert(port) {
                return port;
            }
        };
        let ports: Vec<(u16, u16, u16)> = (0..count).map(|_| (distinct(), distinct(), distinct())).collect();
        let voters: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, _, controller))| format!("{}@127.0.0.1:{controller}", i + 1))
            .collect();
        let copies = count.min(3);
        let (client_protocol, client_settings) = match &security {
            Security::Plaintext => ("PLAINTEXT", String::new()),
            Security::Scram { .. } => (
                "SASL_PLAINTEXT",
                "sasl.enabled.mechanisms=SCRAM-SHA-512\n\
                 listener.name.client.scram-sha-512.sasl.jaas.config=\
                 org.apache.kafka.common.security.scram.ScramLoginModule required;\n"
                    .to_owned(),
            ),
            Security::MutualTls { cert, key, ca } => {
                // One PEM file with the key and its certificate, as Kafka's PEM key store takes.
                let store = dir.path().join("broker-keystore.pem");
                let pem = format!(
                    "{}{}",
                    std::fs::read_to_string(key).expect("broker key"),
                    std::fs::read_to_string(cert).expect("broker cert")
                );
                std::fs::write(&store, pem).expect("key store");
                (
                    "SSL",
                    format!(
                        "listener.name.client.ssl.keystore.type=PEM\n\
                         listener.name.client.ssl.keystore.location={}\n\
                         listener.name.client.ssl.truststore.type=PEM\n\
                         listener.name.client.ssl.truststore.location={}\n\
                         listener.name.client.ssl.client.auth=required\n",
                        store.display(),
                        ca.display()
                    ),
                )
            }
        };
        let voters = voters.join(",");
        let mut nodes = Vec::new();
        for (i, (port, internal, controller)) in ports.iter().enumerate() {
            let id = i + 1;
            let properties = dir.path().join(format!("server-{id}.properties"));
            std::fs::write(
                &properties,
                format!(
                    "process.roles=broker,controller\n\
                     node.id={id}\n\
                     controller.quorum.voters={}\n\
                     listeners=CLIENT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal},CONTROLLER://127.0.0.1:{controller}\n\
                     advertised.listeners=CLIENT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}\n\
                     inter.broker.listener.name=INTERNAL\n\
                     controller.listener.names=CONTROLLER\n\
                     listener.security.protocol.map=CLIENT:{client_protocol},INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
                     {client_settings}\
                     log.dirs={}\n\
                     offsets.topic.replication.factor={copies}\n\
                     transaction.state.log.replication.factor={copies}\n\
                     transaction.state.log.min.isr={}\n\
                     offsets.topic.num.partitions=3\n\
                     transaction.state.log.num.partitions=3\n\
                     group.initial.rebalance.delay.ms=0\n",
                    voters,
                    dir.path().join(format!("data-{id}")).display(),
                    copies.min(2),
                ),
            )
            .expect("server.properties");
            let mut format = java(&libs);
            format.args(["kafka.tools.StorageTool", "format", "--cluster-id", CLUSTER_ID, "--config"]).arg(&properties);
            if let Security::Scram { user, password } = &security {
                format.args(["--add-scram", &format!("SCRAM-SHA-512=[name={user},password={password}]")]);
            }
            let formatted = format.output().expect("run kafka-storage format");
            assert!(formatted.status.success(), "kafka-storage format: {}", String::from_utf8_lossy(&formatted.stderr));
            nodes.push(Node { child: None, port: *port, properties, log: dir.path().join(format!("broker-{id}.log")) });
        }
        let mut broker = KafkaBroker { nodes, dir };
        for i in 0..count {
            broker.spawn(i);
        }
        for i in 0..count {
            broker.wait_listening(i);
        }
        broker
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&node.log).expect("broker log");
        let child = java(&libs())
            .arg("kafka.Kafka")
            .arg(&node.properties)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start kafka.Kafka");
        node.child = Some(child);
    }

    fn wait_listening(&self, i: usize) {
        let port = self.nodes[i].port;
        let deadline = Instant::now() + START;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "Kafka node {} did not listen on {port}:\n{}", i + 1, self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The process id of node `i` (from 0), while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// Kills node `i` (from 0) with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `i` again on its data, and waits until it listens.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_listening(i);
    }

    /// `host:port` of every node, for a client's `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect::<Vec<_>>().join(",")
    }

    /// What the nodes have logged so far.
    pub fn log(&self) -> String {
        self.nodes.iter().map(|n| std::fs::read_to_string(&n.log).unwrap_or_default()).collect::<Vec<_>>().join("\n")
    }

    /// The directory the nodes' files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every record of `topic` (all partitions, from the start to the end offsets found),
    /// read by confluent-kafka with `isolation` (`read_committed`, `read_uncommitted`): a JSON
    /// object each, `{partition, offset, key, headers, value}`.
    pub async fn read(&self, topic: &str, isolation: &str) -> Vec<serde_json::Value> {
        let script = crate::workspace_root().join("tests/python/kafka_client.py");
        let out = tokio::process::Command::new("python3")
            .arg(script)
            .args(["read", &self.bootstrap(), topic, isolation])
            .output()
            .await
            .expect("python3");
        assert!(out.status.success(), "read {topic}: {}", String::from_utf8_lossy(&out.stderr));
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        list.as_array().cloned().unwrap_or_default()
    }

    /// Writes `records` (`{key, value, headers: [[name, value]], partition?}` each) to `topic`
    /// as someone else's producer would (confluent-kafka, the Java client's partitioner), one
    /// at a time; each one's (partition, offset).
    pub async fn produce(&self, topic: &str, records: &[serde_json::Value]) -> Vec<(i32, i64)> {
        use tokio::io::AsyncWriteExt;
        let script = crate::workspace_root().join("tests/python/kafka_client.py");
        let mut child = tokio::process::Command::new("python3")
            .arg(script)
            .args(["produce", &self.bootstrap(), topic])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut input = String::new();
        for r in records {
            input.push_str(&r.to_string());
            input.push('\n');
        }
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).await.expect("write records");
        drop(stdin);
        let out = child.wait_with_output().await.expect("produce");
        assert!(out.status.success(), "produce to {topic}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    }

    /// Waits until no partition is under-replicated (every node that is up caught up), as an
    /// operator does between the steps of a rolling restart.
    pub fn wait_replicated(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.topics(&["--describe", "--under-replicated-partitions"]);
            let listed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if out.status.success() && listed.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "still under-replicated after {timeout:?}:\n{listed}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Deletes the records of `topic`/`partition` below `before`, as Kafka's
    /// `kafka-delete-records` does (what retention does to the oldest).
    pub fn delete_records(&self, topic: &str, partition: i32, before: i64) {
        let file = self.dir.path().join(format!("delete-{topic}-{partition}-{before}.json"));
        let spec = serde_json::json!({
            "version": 1,
            "partitions": [{ "topic": topic, "partition": partition, "offset": before }],
        });
        std::fs::write(&file, spec.to_string()).unwrap();
        let out = java(&libs())
            .args(["org.apache.kafka.tools.DeleteRecordsCommand", "--bootstrap-server", &self.bootstrap()])
            .arg("--offset-json-file")
            .arg(&file)
            .output()
            .expect("run kafka-delete-records");
        assert!(out.status.success(), "kafka-delete-records: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Runs Kafka's `kafka-topics` against these brokers with `args` (plaintext only).
    pub fn topics(&self, args: &[&str]) -> Output {
        java(&libs())
            .args(["org.apache.kafka.tools.TopicCommand", "--bootstrap-server", &self.bootstrap()])
            .args(args)
            .output()
            .expect("run kafka-topics")
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// The `Edge-Seq` headers of `records` (`epoch:lane:seq`), in the order given.
pub fn seqs(records: &[serde_json::Value]) -> Vec<String> {
    records.iter().map(|r| r["headers"]["Edge-Seq"].as_str().unwrap_or("?").to_owned()).collect()
}
