//! `[uplink]`: the QUIC bridge to the cloud, and its own check.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared::units::{ByteSize, HumanDuration};

use shared::check::Problems;

/// The QUIC uplink to a cloud bridge (ehb/1, mutual TLS).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UplinkConfig {
    /// The bridge's UDP address, `host:port`: the one-bridge spelling of `servers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Bridges serving this fleet, `host:port` each (a name may resolve to several addresses;
    /// each is a bridge). The edge starts at a random one, moves on to the next when a
    /// connection fails or a bridge is busy, and stays where a session works: any bridge
    /// serves any edge, from the marks in the shared sink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<String>,
    /// The name every bridge's certificate must carry. Default: the host part of each server.
    pub server_name: Option<String>,
    /// The CA that signed the bridge's certificate (PEM).
    pub ca: PathBuf,
    /// This edge's client certificate and key (PEM); the cloud knows the edge by the
    /// certificate's first DNS name.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Batches sent and not yet acked at most. Default: 8.
    #[serde(default = "default_window")]
    pub window: usize,
    /// Records per batch at most (a batch also stops at 8 MiB of messages). Default: 1024. Each
    /// batch costs a spool transaction for its ack, a JetStream batch and a committed mark:
    /// draining a million 1 KiB records on the 2-core test machine, 1024 reached a median 0.74
    /// of raw JetStream publishing over eight drains, 512 a median 0.70 over eleven.
    #[serde(default = "default_batch_records")]
    pub batch_records: usize,
    /// How long records may wait for a batch to fill before it is sent anyway; a full batch
    /// goes at once, so this only matters at low rates. Longer makes fuller batches (better
    /// compression, fewer datagrams) at the cost of up to that much latency to the cloud: on the
    /// shared trace, 1s sends 0.29 of the topic and payload bytes, 100ms about 0.4 (see
    /// docs/BENCHMARKS.md). Default: 1s.
    #[serde(default = "default_linger")]
    pub linger: HumanDuration,
    /// zstd level for batches (1 fast .. 19 small). Default: 3.
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
    /// zstd dictionary per class, trained on the edge's own traffic; 0 turns dictionaries off.
    /// It pays most for short batches (low rates, short linger). Default: 4KiB.
    #[serde(default = "default_dict_size")]
    pub dict_size: ByteSize,
    /// Sample bytes per class a dictionary is trained on. Default: 32KiB.
    #[serde(default = "default_dict_samples")]
    pub dict_samples: ByteSize,
    /// Age after which a class's dictionary is trained again on fresh traffic. Default: 1h.
    #[serde(default = "default_dict_retrain")]
    pub dict_retrain: HumanDuration,
    /// QUIC congestion controller: `bbr` (default), `cubic` or `new-reno`. Loss-based
    /// controllers halve their rate at every random loss: at 50 ms RTT and 1 % loss, cubic
    /// drained 513 msg/s where bbr drains thousands (docs/BENCHMARKS.md), and radio links lose
    /// packets at random.
    #[serde(default)]
    pub congestion: Congestion,
    /// Share of batches reserved for lower-priority lanes while they have records. Default: 0.1.
    #[serde(default = "default_lower_share")]
    pub lower_lane_share: f64,
    /// Ping interval. Default: 5s.
    #[serde(default = "default_keepalive")]
    pub keepalive: HumanDuration,
    /// Connected but no ack or pong for this long: the link is reported degraded, and a bridge
    /// known to answer probes is probed; three unanswered rounds end the session so the edge
    /// moves on (a slow bridge answers its probes and keeps the edge). Default: 2s.
    #[serde(default = "default_ack_timeout")]
    pub ack_timeout: HumanDuration,
    /// Reconnect backoff, doubled per failure with jitter, between these bounds.
    #[serde(default = "default_backoff_min")]
    pub backoff_min: HumanDuration,
    #[serde(default = "default_backoff_max")]
    pub backoff_max: HumanDuration,
    /// While the link is down, how often to ask the bridges whether they are back: one
    /// 1,200-byte datagram a bridge answers without a handshake (`shared::proto::probe`). The
    /// edge reconnects as soon as one answers instead of waiting out its backoff; after each
    /// five minutes without an answer the interval doubles, up to `backoff_max`. 0s turns probes
    /// off. Default: 2s.
    #[serde(default = "default_probe_interval")]
    pub probe_interval: HumanDuration,
    /// Downlink messages this edge holds received and not yet stored, at most (1 ..= 256), and
    /// their bytes: past the bytes nothing more comes until it holds none. Said to the bridge in
    /// the hello (protocol version 9), which sends within it; a bridge that passes it ends its
    /// session. They bound what the cloud can make wait in this edge's memory for its session
    /// store. A bridge of an older version hears neither and may send 256 of any size its own
    /// window lets through. Defaults: 256, 4MiB (the bridge's default window).
    #[serde(default = "default_down_window_messages")]
    pub down_window_messages: usize,
    #[serde(default = "default_down_window_bytes")]
    pub down_window_bytes: ByteSize,
}

pub use shared::proto::Congestion;

/// Most bridges one edge lists: each is probed while the link is down.
const MAX_SERVERS: usize = 64;

fn default_window() -> usize {
    8
}
fn default_down_window_messages() -> usize {
    shared::proto::down::MAX_DOWN_WINDOW
}
fn default_down_window_bytes() -> ByteSize {
    ByteSize(shared::proto::down::DEFAULT_DOWN_WINDOW_BYTES as u64)
}
/// `batch_records` when the config does not say: records a batch at most.
pub const DEFAULT_BATCH_RECORDS: usize = 1024;

fn default_batch_records() -> usize {
    DEFAULT_BATCH_RECORDS
}
fn default_linger() -> HumanDuration {
    HumanDuration(Duration::from_secs(1))
}
fn default_zstd_level() -> i32 {
    3
}
fn default_dict_size() -> ByteSize {
    ByteSize::kib(4)
}
fn default_dict_samples() -> ByteSize {
    ByteSize::kib(32)
}
fn default_dict_retrain() -> HumanDuration {
    HumanDuration(Duration::from_secs(3600))
}
fn default_lower_share() -> f64 {
    0.1
}
fn default_keepalive() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}
fn default_ack_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(2))
}
fn default_backoff_min() -> HumanDuration {
    HumanDuration(Duration::from_millis(200))
}
fn default_backoff_max() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
fn default_probe_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(2))
}

impl UplinkConfig {
    /// The configured bridges, `server` or `servers`, whichever is given.
    /// What the protocol session takes of this config.
    pub fn session_config(&self) -> shared::proto::edge::EdgeSessionConfig {
        shared::proto::edge::EdgeSessionConfig {
            window: self.window,
            keepalive: self.keepalive.0,
            ack_timeout: self.ack_timeout.0,
            max_down_pending: self.down_window_messages,
            max_down_bytes: self.down_window_bytes.as_usize(),
        }
    }

    pub(crate) fn server_list(&self) -> Vec<String> {
        self.server.iter().chain(&self.servers).cloned().collect()
    }

    pub fn check(&self, p: &mut Problems) {
        match (&self.server, self.servers.is_empty()) {
            (Some(_), false) => p.bad("uplink.servers", "give either server or servers, not both"),
            (None, true) => p.bad("uplink.servers", "no bridge: set servers = [\"host:port\", ...] (or server)"),
            _ => {}
        }
        let key = if self.server.is_some() { "uplink.server" } else { "uplink.servers" };
        for server in self.server_list() {
            if server.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
                p.bad(key, format!("{server:?} is not host:port"));
            }
        }
        if self.servers.len() > MAX_SERVERS {
            p.bad("uplink.servers", format!("{} bridges, more than {MAX_SERVERS}", self.servers.len()));
        }
        if self.window == 0 {
            p.bad("uplink.window", "must be at least 1");
        }
        if self.batch_records == 0 {
            p.bad("uplink.batch_records", "must be at least 1");
        }
        if !(1..=19).contains(&self.zstd_level) {
            p.bad("uplink.zstd_level", format!("{} is outside 1 ..= 19", self.zstd_level));
        }
        let dict = self.dict_size.bytes();
        if dict != 0 && !(1024..=shared::proto::MAX_DICT_BYTES as u64).contains(&dict) {
            p.bad(
                "uplink.dict_size",
                format!(
                    "{} is outside 1KiB ..= {}KiB (or 0 for none)",
                    self.dict_size,
                    shared::proto::MAX_DICT_BYTES >> 10
                ),
            );
        }
        if dict != 0 && self.dict_samples.bytes() < 4 * dict {
            p.bad("uplink.dict_samples", format!("{} is below 4 times dict_size", self.dict_samples));
        }
        if self.dict_retrain.0.is_zero() {
            p.bad("uplink.dict_retrain", "must be more than 0s");
        }
        if !(self.lower_lane_share > 0.0 && self.lower_lane_share <= 0.5) {
            p.bad("uplink.lower_lane_share", format!("{} is outside (0, 0.5]", self.lower_lane_share));
        }
        if self.backoff_min.0 > self.backoff_max.0 {
            p.bad("uplink.backoff_min", "is above backoff_max");
        }
        let most = shared::proto::down::MAX_DOWN_WINDOW;
        if !(1..=most).contains(&self.down_window_messages) {
            p.bad("uplink.down_window_messages", format!("{} is outside 1 ..= {most}", self.down_window_messages));
        }
        if self.down_window_bytes.bytes() < 1024 {
            p.bad("uplink.down_window_bytes", format!("{} is below 1KiB", self.down_window_bytes));
        }
    }
}
