//! A cloud bridge for tests, in process, with a development PKI and an SQLite sink in its own
//! temporary directory; and the `[uplink]` section that points an edge at it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cloud_bridge::Bridge;
use cloud_bridge::certs::Pki;
use cloud_bridge::config::CloudConfig;

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
             [http]\nbind = \"127.0.0.1:0\"\n[sink]\n{sink_section}\n",
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

    /// The `[uplink]` section for `edge` (its certificate from this PKI).
    pub fn uplink_section(&self, edge: &str) -> String {
        self.uplink_section_via(edge, self.bridge.quic_addr())
    }

    /// The `[uplink]` section for `edge`, reaching the bridge at `server` (a relay).
    pub fn uplink_section_via(&self, edge: &str, server: SocketAddr) -> String {
        let (_, cert, key) = self.pki.edges.iter().find(|(id, _, _)| id == edge).expect("edge in the PKI");
        format!(
            "[uplink]\nserver = \"{}\"\nserver_name = \"localhost\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             keepalive = \"500ms\"\nack_timeout = \"2s\"\nbackoff_min = \"50ms\"\nbackoff_max = \"500ms\"\n",
            server,
            self.pki.ca.display(),
            cert.display(),
            key.display()
        )
    }

    pub fn metric(&self, name_and_labels: &str) -> f64 {
        crate::metric(&self.bridge.metrics().encode(), name_and_labels).unwrap_or(0.0)
    }
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
