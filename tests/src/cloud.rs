//! A cloud bridge for tests, in process, with a development PKI and an SQLite sink in its own
//! temporary directory; and the `[uplink]` section that points an edge at it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cloud_bridge::Bridge;
use cloud_bridge::certs::Pki;
use cloud_bridge::config::CloudConfig;
pub use cloud_bridge::fleet::view::{EdgeRow, FleetView, Status};

pub struct TestCloud {
    pub bridge: Bridge,
    pub pki: Pki,
    pub sink: PathBuf,
}

/// A PKI with edge `edge-1` (and any `more`) in `dir`.
pub fn pki(dir: &Path, more: &[&str]) -> Pki {
    let mut edges = vec!["edge-1".to_owned()];
    edges.extend(more.iter().map(|s| (*s).to_owned()));
    cloud_bridge::certs::init(dir, &[], &edges, true).expect("test PKI")
}

/// A PKI made with the `openssl` command, as an operator's own CA would be, for `edge` with
/// certificate serial `edge_serial` (hex): `certs init` never issues a serial with its high bit
/// set, and other CAs do half the time. Returns the PKI and what `openssl x509 -serial` prints
/// for the edge's certificate.
pub fn openssl_pki(dir: &Path, edge: &str, edge_serial: &str) -> (Pki, String) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("openssl output")
    };
    let new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    openssl(
        &[&["req", "-x509"], &new_key[..], &["-keyout", "ossl-ca.key", "-out", "ossl-ca.pem", "-days", "2"]]
            .concat()
            .into_iter()
            .chain(["-subj", "/CN=operator CA", "-addext", "basicConstraints=critical,CA:TRUE"])
            .chain(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            .collect::<Vec<_>>(),
    );
    let issue = |name: &str, cn: &str, serial: &str, ext: &str| {
        std::fs::write(dir.join(format!("{name}.ext")), ext).expect("write extensions");
        let (key, csr, pem) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"));
        let subj = format!("/CN={cn}");
        openssl(&[&["req"], &new_key[..], &["-keyout", &key, "-out", &csr, "-subj", &subj]].concat());
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ossl-ca.pem",
            "-CAkey",
            "ossl-ca.key",
            "-set_serial",
            serial,
            "-days",
            "2",
            "-out",
            &pem,
            "-extfile",
            &format!("{name}.ext"),
        ]);
        (dir.join(pem), dir.join(key))
    };
    let (server_cert, server_key) = issue(
        "ossl-cloud",
        "cloud-bridge",
        "0x1001",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    let (cert, key) = issue(
        &format!("ossl-edge-{edge}"),
        edge,
        &format!("0x{edge_serial}"),
        &format!("subjectAltName=DNS:{edge}\nextendedKeyUsage=clientAuth\n"),
    );
    let printed = openssl(&["x509", "-noout", "-serial", "-in", cert.to_str().expect("utf-8 path")]);
    let pki = Pki { ca: dir.join("ossl-ca.pem"), server_cert, server_key, edges: vec![(edge.to_owned(), cert, key)] };
    (pki, printed.trim().to_owned())
}

impl TestCloud {
    /// Starts a bridge on `bind` (port 0 for any) writing to `dir/central.db`; `extra` goes
    /// into `[server]`.
    pub async fn start(dir: &Path, pki: Pki, bind: SocketAddr, extra: &str) -> TestCloud {
        let sink = dir.join("central.db");
        let section = format!("kind = \"sqlite\"\npath = \"{}\"\n", sink.display());
        Self::start_with_sink(dir, pki, bind, extra, &section, sink).await
    }

    /// A bridge whose `[sink]` section is `sink_section`.
    pub async fn start_with_sink(
        dir: &Path,
        pki: Pki,
        bind: SocketAddr,
        extra: &str,
        sink_section: &str,
        sink: PathBuf,
    ) -> TestCloud {
        crate::init_tracing();
        let text = format!(
            "[server]\nbind = \"{bind}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n{extra}\n\
             [http]\nbind = \"127.0.0.1:0\"\n[fleet]\nstate_interval = \"200ms\"\n[sink]\n{sink_section}\n",
            pki.server_cert.display(),
            pki.server_key.display(),
            pki.ca.display(),
        );
        let path = dir.join("cloud.toml");
        std::fs::write(&path, text).expect("write cloud config");
        let config = CloudConfig::load(&path).unwrap_or_else(|e| panic!("cloud config: {e}"));
        // A bridge restarted in the same process on the same port: quinn's endpoint driver lets
        // go of the old socket a moment after the endpoint is dropped.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        let bridge = loop {
            match Bridge::start(config.clone()).await {
                Ok(b) => break b,
                Err(e) if e.to_string().contains("in use") && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => panic!("bridge start: {e}"),
            }
        };
        TestCloud { bridge, pki, sink }
    }

    /// A bridge on `bind` whose sink is the JetStream server at `url` (default stream and
    /// buckets); `extra` goes into `[server]`.
    pub async fn start_on_jetstream(dir: &Path, pki: Pki, bind: SocketAddr, extra: &str, url: &str) -> TestCloud {
        let section = format!("kind = \"jetstream\"\nurl = \"{url}\"\n");
        Self::start_with_sink(dir, pki, bind, extra, &section, dir.join("unused")).await
    }

    /// The `[uplink]` section for `edge` (its certificate from this PKI).
    pub fn uplink_section(&self, edge: &str) -> String {
        self.uplink_section_via(edge, self.bridge.quic_addr())
    }

    /// The `[uplink]` section for `edge`, reaching the bridge at `server` (a relay).
    pub fn uplink_section_via(&self, edge: &str, server: SocketAddr) -> String {
        uplink_section(&self.pki, edge, &[server], "")
    }

    pub fn metric(&self, name_and_labels: &str) -> f64 {
        crate::metric(&self.bridge.metrics().encode(), name_and_labels).unwrap_or(0.0)
    }

    /// The fleet view as this bridge serves it at `/edges` (every bridge on its sink); empty if
    /// it cannot be read.
    pub fn fleet(&self) -> FleetView {
        fleet_view(self.bridge.http_addr().expect("the test bridge serves HTTP"))
    }

    /// `edge`'s row of the fleet view.
    pub fn edge_row(&self, edge: &str) -> Option<EdgeRow> {
        self.fleet().edges.into_iter().find(|e| e.edge == edge)
    }

    /// `edge`'s committed seq of `lane` in the fleet view (0 if none yet).
    pub fn committed(&self, edge: &str, lane: u8) -> u64 {
        let row = self.edge_row(edge);
        row.and_then(|e| e.lanes.iter().find(|l| l.lane == lane).map(|l| l.committed)).unwrap_or(0)
    }
}

/// The fleet view served at `http` (`GET /edges`); empty if it cannot be read.
pub fn fleet_view(http: SocketAddr) -> FleetView {
    let body = crate::http_get(http, "/edges");
    serde_json::from_str(&body).unwrap_or(FleetView {
        taken_ms: 0,
        bridges: Vec::new(),
        edges: Vec::new(),
        downlink: Vec::new(),
        downlink_refused: Vec::new(),
    })
}

/// An `[uplink]` section for `edge` (its certificate from `pki`) with fast test timings, to
/// `servers` (`server` for one, `servers` for more); `extra` is appended to it.
pub fn uplink_section(pki: &Pki, edge: &str, servers: &[SocketAddr], extra: &str) -> String {
    let fast = "keepalive = \"500ms\"\nack_timeout = \"2s\"\nbackoff_min = \"50ms\"\nbackoff_max = \"500ms\"\n";
    uplink_section_with_defaults(pki, edge, servers, &format!("{fast}{extra}"))
}

/// [`uplink_section`] with the shipped timings (keepalive, ack timeout, backoff, probes).
pub fn uplink_section_with_defaults(pki: &Pki, edge: &str, servers: &[SocketAddr], extra: &str) -> String {
    let (_, cert, key) = pki.edges.iter().find(|(id, _, _)| id == edge).expect("edge in the PKI");
    let servers = match servers {
        [one] => format!("server = \"{one}\""),
        many => format!("servers = [{}]", many.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ")),
    };
    format!(
        "[uplink]\n{servers}\nserver_name = \"localhost\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n{extra}\n",
        pki.ca.display(),
        cert.display(),
        key.display()
    )
}

/// A record in the sink: edge, lane, seq, kind, topic, payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRow {
    pub edge: String,
    pub lane: u8,
    pub seq: u64,
    pub kind: String,
    pub topic: Option<String>,
    pub payload: Vec<u8>,
    pub headers: Option<String>,
}

/// Everything in a sink file, in (edge, lane, seq) order.
pub fn sink_rows(path: &Path) -> Vec<SinkRow> {
    let Ok(conn) = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY) else {
        return Vec::new();
    };
    let Ok(mut stmt) = conn
        .prepare("SELECT edge_id, lane, seq, kind, topic, payload, headers FROM records ORDER BY edge_id, lane, seq")
    else {
        return Vec::new();
    };
    stmt.query_map([], |r| {
        Ok(SinkRow {
            edge: r.get(0)?,
            lane: r.get(1)?,
            seq: r.get(2)?,
            kind: r.get(3)?,
            topic: r.get(4)?,
            payload: r.get(5)?,
            headers: r.get(6)?,
        })
    })
    .map(|rows| rows.filter_map(Result::ok).collect())
    .unwrap_or_default()
}

/// `cloud-bridge ARGS --config CONFIG`, as an operator runs it: success, stdout, stderr.
pub fn cli(config: &Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(crate::workspace_bin("cloud-bridge"))
        .args(args)
        .args(["--config", config.to_str().expect("a UTF-8 path")])
        .output()
        .expect("run cloud-bridge");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `records` of (`edge`, `epoch`, `lane`) staged and published on `sink`, as a session does with
/// a batch whose turn came; no mark.
pub async fn publish<S: cloud_bridge::sink::RecordSink>(
    sink: &S,
    edge: &str,
    epoch: &str,
    lane: u8,
    records: Vec<shared::proto::WireRecord>,
) -> Result<(), cloud_bridge::sink::SinkError> {
    let staged = sink.stage(edge.to_owned(), epoch.to_owned(), lane, records).await?;
    sink.publish(staged).await
}

/// Checks on any sink that a downlink read stops at its byte budget (`ReadLimit::bytes`) as well
/// as at its count: `edge` (with nothing stored yet) gets five messages whose `Outgoing::bytes`
/// are 100, 100, 300, 2,000 and 100. A budget of 250 takes the first three (the one that
/// reaches it is the last taken), a budget below the first still takes it, and a message past
/// the budget is read alone, then the rest.
pub async fn check_reads_stop_at_their_byte_budget<S: cloud_bridge::sink::DownlinkStore>(sink: &S, edge: &str) {
    use cloud_bridge::sink::downlink::{DownBounds, Enqueued, Outgoing, ReadLimit};
    let bounds = DownBounds { messages: 100, bytes: 1 << 20 };
    let topic = "cmd/a";
    let mut seqs = Vec::new();
    for bytes in [100usize, 100, 300, 2000, 100] {
        let msg =
            Outgoing { topic: topic.into(), payload: vec![b'x'; bytes - topic.len()], qos: 1, ..Default::default() };
        assert_eq!(msg.bytes(), bytes as u64);
        match sink.enqueue(edge, &msg, bounds).await.expect("stored") {
            Enqueued::Stored { seq } => seqs.push(seq),
            other => panic!("not stored: {other:?}"),
        }
    }
    let read = |after, bytes| async move {
        let got = sink.down_read(edge, after, ReadLimit { messages: 100, bytes }).await.expect("read");
        got.iter().map(|p| (p.seq, p.msg.bytes())).collect::<Vec<_>>()
    };
    let first = read(0, 250).await;
    assert_eq!(first, [(seqs[0], 100), (seqs[1], 100), (seqs[2], 300)], "reached at the third");
    assert_eq!(read(0, 1).await, [(seqs[0], 100)], "one, whatever the budget");
    assert_eq!(read(seqs[2], 500).await, [(seqs[3], 2000)], "a message past the budget, alone");
    assert_eq!(read(seqs[3], 500).await, [(seqs[4], 100)]);
    let by_count = sink.down_read(edge, 0, ReadLimit { messages: 2, bytes: u64::MAX }).await.expect("read");
    assert_eq!(by_count.iter().map(|p| p.seq).collect::<Vec<_>>(), seqs[..2], "the count still bounds it");
}
