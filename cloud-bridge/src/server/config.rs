//! `[server]`: the QUIC listener, its certificates, and what one session may hold.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// UDP address of the QUIC listener.
    pub bind: SocketAddr,
    /// The bridge's certificate chain and key (PEM).
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The fleet CA: edges must present a client certificate it signed.
    pub client_ca: PathBuf,
    /// Serial numbers (hex) of edge certificates refused even though the CA signed them, as
    /// `openssl x509 -serial` prints them or with colons; compared by value, so leading zeros
    /// do not matter.
    #[serde(default)]
    pub deny_serials: Vec<String>,
    /// Batches one connection may send ahead of a missing one. Default: 64.
    #[serde(default = "default_max_held")]
    pub max_held: usize,
    /// QUIC congestion controller for what the bridge sends (model chunks): `bbr` (default),
    /// `cubic` or `new-reno`. At 50 ms RTT and 1 % random loss cubic halves its rate at every
    /// loss (docs/BENCHMARKS.md compares them on a model transfer).
    #[serde(default)]
    pub congestion: shared::proto::Congestion,
    /// UDP receive and send buffer of the QUIC socket. A fleet reconnecting at once arrives as
    /// bursts of 1,200-byte Initial packets; the kernel's default (208 KiB) drops them and their
    /// handshakes time out. The kernel caps it at `net.core.rmem_max` and `wmem_max` (the bridge
    /// warns when it got less). Default: 4 MiB.
    #[serde(default = "default_socket_buffer")]
    pub socket_buffer: shared::units::ByteSize,
}

fn default_max_held() -> usize {
    64
}

fn default_socket_buffer() -> shared::units::ByteSize {
    shared::units::ByteSize(4 << 20)
}
