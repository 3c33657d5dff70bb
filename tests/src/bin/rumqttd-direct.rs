//! rumqttd's router and `Server` on a tokio runtime, with no front: the baseline that shows
//! what edge-node's front adds (scripts/bench-local.sh). Same router settings as edge-node's
//! defaults; anonymous, loopback only. Usage: rumqttd-direct PORT

use std::net::SocketAddr;

use rumqttd::protocol::v4::V4;
use rumqttd::{ConnectionSettings, LinkType, RouterConfig, Server, ServerSettings};

fn main() -> anyhow::Result<()> {
    let port: u16 = std::env::args().nth(1).unwrap_or_else(|| "1883".into()).parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let router = rumqttd::Router::new(
        0,
        RouterConfig {
            max_connections: 1016,
            max_outgoing_packet_count: 200,
            max_segment_size: 1 << 20,
            max_segment_count: 4,
            custom_segment: None,
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
    );
    let router_tx = router.spawn();
    let settings = ServerSettings {
        name: "direct".into(),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        tls: None,
        next_connection_delay_ms: 0,
        connections: ConnectionSettings {
            connection_timeout_ms: 10_000,
            max_payload_size: 1 << 20,
            max_inflight_count: 100,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        },
    };
    runtime.block_on(async move {
        let mut server = Server::new(settings, router_tx, V4);
        server.start(LinkType::Remote).await.map_err(|e| anyhow::anyhow!("{e}"))
    })
}
