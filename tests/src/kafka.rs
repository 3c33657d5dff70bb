//! A real Apache Kafka broker for tests, in KRaft mode (broker and controller in one process,
//! no ZooKeeper): on free loopback ports, its log in a temporary directory, killed on drop. Its
//! jars come from Maven Central through scripts/fetch-kafka.sh, which the install script runs
//! once; this asks the same script for the folder, so both agree on where it is.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long a broker may take to listen: a JVM's start on two shared cores.
const START: Duration = Duration::from_secs(90);

pub struct KafkaBroker {
    child: Child,
    pub port: u16,
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
    /// A single broker that is its own controller, formatted afresh.
    pub fn start() -> KafkaBroker {
        let libs = libs();
        let dir = tempfile::tempdir().expect("kafka dir");
        let (port, controller) = (crate::free_port(), crate::free_port());
        let properties = dir.path().join("server.properties");
        let data = dir.path().join("data");
        std::fs::write(
            &properties,
            format!(
                "process.roles=broker,controller\n\
                 node.id=1\n\
                 controller.quorum.voters=1@127.0.0.1:{controller}\n\
                 listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
                 advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
                 controller.listener.names=CONTROLLER\n\
                 listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
                 log.dirs={}\n\
                 offsets.topic.replication.factor=1\n\
                 transaction.state.log.replication.factor=1\n\
                 transaction.state.log.min.isr=1\n\
                 group.initial.rebalance.delay.ms=0\n",
                data.display()
            ),
        )
        .expect("server.properties");
        let format = java(&libs)
            .args(["kafka.tools.StorageTool", "format", "--cluster-id", "MkU3OEVBNTcwNTJENDM2Qg", "--config"])
            .arg(&properties)
            .output()
            .expect("run kafka-storage format");
        assert!(format.status.success(), "kafka-storage format: {}", String::from_utf8_lossy(&format.stderr));
        let log = std::fs::File::create(dir.path().join("broker.log")).expect("broker log");
        let child = java(&libs)
            .arg("kafka.Kafka")
            .arg(&properties)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start kafka.Kafka");
        let broker = KafkaBroker { child, port, dir };
        let deadline = Instant::now() + START;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the Kafka broker did not listen on {port}:\n{}", broker.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        broker
    }

    /// `host:port` for a client's `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What the broker has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// Runs Kafka's `kafka-topics` against this broker with `args`.
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
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
