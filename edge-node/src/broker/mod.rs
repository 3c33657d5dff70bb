//! The embedded rumqttd router and its internal MQTT 5 listener on loopback. MQTT 3.1.1 clients
//! reach it too, translated by the front (see `front::compat` for why not rumqttd's v4 server).
//!
//! rumqttd's `Broker::start` blocks forever and binds by itself; instead this module spawns the
//! router thread and runs rumqttd's public `Server` on our own runtime. The internal listeners
//! are reachable only through the front: they bind loopback ports that nothing advertises, and
//! they accept a CONNECT only with a per-process random secret the front injects, so a local
//! process that finds the port still cannot bypass authentication and the ACL.
//!
//! rumqttd's router thread has no stop handle; it idles when the node stops and ends with the
//! process.

pub mod codec;
mod config;
pub mod core;
pub mod driver;
pub mod log;
pub mod message;
pub mod metrics;
pub mod store;

pub use config::BrokerConfig;

use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use rumqttd::protocol::v5::V5;
use rumqttd::{ConnectionSettings, LinkType, RouterConfig, Server, ServerSettings};
use tokio::task::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("internal broker listener could not start after {attempts} attempts: {last}")]
    Listen { attempts: usize, last: String },
}

/// Connections the front and the probe may need beyond the configured client limit.
const INTERNAL_CONNECTIONS: usize = 16;

#[derive(Debug)]
pub struct InternalBroker {
    pub addr: SocketAddr,
    pub secret: Arc<str>,
    server: JoinHandle<()>,
}

impl InternalBroker {
    pub async fn start(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let router = rumqttd::Router::new(
            0,
            RouterConfig {
                max_connections: config.max_connections + INTERNAL_CONNECTIONS,
                // Batch size for QoS0 reads per scheduling round; QoS1 is bounded by inflight.
                max_outgoing_packet_count: 200,
                max_segment_size: config.segment_size.as_usize(),
                max_segment_count: config.segment_count,
                custom_segment: None,
                initialized_filters: None,
                shared_subscriptions_strategy: Default::default(),
            },
        );
        let router_tx = router.spawn();

        let mut secret = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut secret);
        let secret: Arc<str> = secret.iter().map(|b| format!("{b:02x}")).collect::<String>().into();

        let mut connections = ConnectionSettings {
            connection_timeout_ms: u16::try_from(config.connect_timeout.0.as_millis()).unwrap_or(u16::MAX),
            // rumqttd checks the whole packet against this, the front checks first.
            max_payload_size: config.max_packet_size.as_usize(),
            max_inflight_count: usize::from(config.max_inflight),
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        };
        let expected = secret.clone();
        connections.set_auth_handler(move |_client, _user, pass: String| {
            let ok = constant_time_eq(pass.as_bytes(), expected.as_bytes());
            async move { ok }
        });

        let (addr, server) = listen("internal-v5", &connections, |settings| {
            let mut server = Server::new(settings, router_tx.clone(), V5);
            tokio::spawn(async move {
                if let Err(e) = server.start(LinkType::Remote).await {
                    tracing::error!(error = %e, "internal MQTT 5 listener stopped");
                }
            })
        })
        .await?;
        Ok(Self { addr, secret, server })
    }
}

impl Drop for InternalBroker {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// rumqttd binds its own listener and does not say on which port, so pick a free loopback port,
/// start the server on it, and retry on a fresh port if another process took it in between.
async fn listen(
    name: &str,
    connections: &ConnectionSettings,
    spawn: impl Fn(ServerSettings) -> JoinHandle<()>,
) -> Result<(SocketAddr, JoinHandle<()>), BrokerError> {
    const ATTEMPTS: usize = 5;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        let addr = match StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
            Ok(a) => a,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        let handle = spawn(ServerSettings {
            name: name.to_owned(),
            listen: addr,
            tls: None,
            next_connection_delay_ms: 0,
            connections: connections.clone(),
        });
        // Ready once the port is taken (probing by bind, not connect, so rumqttd does not log a
        // client that never sent CONNECT); a bind failure ends the task instead.
        for _ in 0..400 {
            if handle.is_finished() {
                break;
            }
            if StdTcpListener::bind(addr).is_err() {
                return Ok((addr, handle));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        handle.abort();
        last = format!("{name} on {addr} did not start");
    }
    Err(BrokerError::Listen { attempts: ATTEMPTS, last })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
