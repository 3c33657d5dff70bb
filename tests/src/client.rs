//! A small wrapper over rumqttc (MQTT 3.1.1) for tests: connect and see the CONNACK, subscribe
//! and see the SUBACK codes, receive publishes with a timeout.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use rumqttc::{AsyncClient, ConnectReturnCode, Event, MqttOptions, Packet, Publish, QoS, SubscribeReasonCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub struct Client {
    pub client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Result<Packet, String>>,
    task: JoinHandle<()>,
    pending: VecDeque<Publish>,
}

/// Options for a client id against `addr`; adjust before `connect`.
pub fn options(addr: SocketAddr, id: &str) -> MqttOptions {
    let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    o.set_keep_alive(Duration::from_secs(5));
    o.set_max_packet_size(4 * 1024 * 1024, 4 * 1024 * 1024);
    o
}

impl Client {
    /// Connects and waits for the CONNACK; `Err` carries the refusal or the connection error.
    pub async fn connect(options: MqttOptions) -> Result<Client, String> {
        let (client, mut eventloop) = AsyncClient::new(options, 1000);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(p)) => {
                        if tx.send(Ok(p)).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Outgoing(_)) => {}
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                }
            }
        });
        let first = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        match first {
            Ok(Some(Ok(Packet::ConnAck(ack)))) if ack.code == ConnectReturnCode::Success => {
                Ok(Client { client, rx, task, pending: VecDeque::new() })
            }
            Ok(Some(Ok(other))) => Err(format!("unexpected first packet {other:?}")),
            Ok(Some(Err(e))) => Err(e),
            Ok(None) => Err("event loop ended".into()),
            Err(_) => Err("no CONNACK in 10 s".into()),
        }
    }

    pub async fn anonymous(addr: SocketAddr, id: &str) -> Client {
        Client::connect(options(addr, id)).await.unwrap_or_else(|e| panic!("connect {id}: {e}"))
    }

    /// Subscribes and returns the SUBACK codes.
    pub async fn subscribe(&mut self, filter: &str, qos: QoS) -> Vec<SubscribeReasonCode> {
        self.subscribe_many(&[(filter, qos)]).await
    }

    /// Subscribes to several filters in one SUBSCRIBE and returns the SUBACK codes.
    pub async fn subscribe_many(&mut self, filters: &[(&str, QoS)]) -> Vec<SubscribeReasonCode> {
        let filters = filters.iter().map(|(f, q)| rumqttc::SubscribeFilter::new((*f).to_owned(), *q));
        self.client.subscribe_many(filters).await.expect("queue subscribe");
        loop {
            match self.next(Duration::from_secs(10)).await {
                Some(Ok(Packet::SubAck(ack))) => return ack.return_codes,
                Some(Ok(Packet::Publish(p))) => self.pending.push_back(p),
                Some(Ok(_)) => {}
                other => panic!("no SUBACK: {other:?}"),
            }
        }
    }

    /// Waits for `n` PUBACKs (publishes received meanwhile are kept for `recv`); whether they
    /// came within `timeout`. [`Client::publish`] only queues: a test that needs its QoS 1
    /// publishes stored before it goes on waits here.
    pub async fn acked(&mut self, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut got = 0;
        while got < n {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(Ok(Packet::PubAck(_))) => got += 1,
                Some(Ok(Packet::Publish(p))) => self.pending.push_back(p),
                Some(Ok(_)) => {}
                _ => return false,
            }
        }
        true
    }

    pub async fn publish(&self, topic: &str, qos: QoS, retain: bool, payload: impl Into<Vec<u8>>) {
        self.client.publish(topic, qos, retain, payload).await.expect("queue publish");
    }

    /// The next PUBLISH received within `timeout`.
    pub async fn recv(&mut self, timeout: Duration) -> Option<Publish> {
        if let Some(p) = self.pending.pop_front() {
            return Some(p);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(Ok(Packet::Publish(p))) => return Some(p),
                Some(Ok(_)) => {}
                _ => return None,
            }
        }
    }

    /// Waits for the connection to end; returns its error text, or `None` if still up.
    pub async fn closed(&mut self, timeout: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(Err(e)) => return Some(e),
                Some(Ok(Packet::Publish(p))) => self.pending.push_back(p),
                Some(Ok(Packet::Disconnect)) => return Some("DISCONNECT".into()),
                Some(Ok(_)) => {}
                None if tokio::time::Instant::now() >= deadline => return None,
                None => return Some("event loop ended".into()),
            }
        }
    }

    async fn next(&mut self, timeout: Duration) -> Option<Result<Packet, String>> {
        tokio::time::timeout(timeout, self.rx.recv()).await.ok().flatten()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A raw MQTT 3.1.1 publisher: sends QoS1 publishes on `topic` one after another, payloads
/// `r<round>-<i>`, and returns those whose PUBACK arrived before the connection died.
pub async fn publish_until_killed(addr: SocketAddr, round: u32, topic: &str) -> Vec<String> {
    let progress = std::sync::atomic::AtomicU64::new(0);
    let tag = format!("r{round}");
    publish_range(addr, &format!("crash-{round}"), topic, &tag, 1..u32::MAX, &progress)
        .await
        .into_iter()
        .map(|i| format!("{tag}-{i}"))
        .collect()
}

/// A raw MQTT 3.1.1 publisher on `topic`: QoS1 publishes with payloads `<tag>-<i>` for `i` in
/// `range`, each after the last one's PUBACK. Counts PUBACKs in `progress`; returns the indices
/// acknowledged, ending early when the connection dies.
pub async fn publish_range(
    addr: SocketAddr,
    client_id: &str,
    topic: &str,
    tag: &str,
    range: std::ops::Range<u32>,
    progress: &std::sync::atomic::AtomicU64,
) -> Vec<u32> {
    let mut acked = Vec::new();
    let Ok(mut c) = tokio::net::TcpStream::connect(addr).await else { return acked };
    let mut connect = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60];
    connect.extend((client_id.len() as u16).to_be_bytes());
    connect.extend(client_id.as_bytes());
    let frame = packet(0x10, &connect);
    let mut connack = [0u8; 4];
    if c.write_all(&frame).await.is_err() || c.read_exact(&mut connack).await.is_err() || connack[3] != 0 {
        return acked;
    }
    for i in range {
        let pkid = (i % u32::from(u16::MAX)) as u16 + 1;
        let payload = format!("{tag}-{i}");
        let mut body = (topic.len() as u16).to_be_bytes().to_vec();
        body.extend(topic.as_bytes());
        body.extend(pkid.to_be_bytes());
        body.extend(payload.as_bytes());
        let frame = packet(0x32, &body);
        if c.write_all(&frame).await.is_err() {
            return acked;
        }
        let mut ack = [0u8; 4];
        match tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut ack)).await {
            Ok(Ok(_)) if ack[0] == 0x40 && u16::from_be_bytes([ack[2], ack[3]]) == pkid => {
                acked.push(i);
                progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            _ => return acked,
        }
    }
    acked
}

/// An MQTT packet: the fixed header byte, the remaining length as a variable byte integer, then
/// `body`.
fn packet(header: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![header];
    let mut len = body.len();
    loop {
        let byte = (len % 128) as u8;
        len /= 128;
        out.push(if len > 0 { byte | 0x80 } else { byte });
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// A durable MQTT 5 subscriber to `filter` at QoS 1 (client id `app`, session kept an hour), once
/// its SUBACK came, and what it receives.
pub async fn durable_v5_subscriber(
    addr: SocketAddr,
    filter: &str,
) -> (rumqttc::v5::AsyncClient, mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::Publish>) {
    use rumqttc::v5::mqttbytes::v5::{ConnectProperties, Packet as V5Packet};
    use rumqttc::v5::{Event as V5Event, MqttOptions as V5Options};
    let mut options = V5Options::new("app", addr.ip().to_string(), addr.port());
    options.set_clean_start(false);
    options.set_connect_properties(ConnectProperties { session_expiry_interval: Some(3600), ..Default::default() });
    let (client, mut events) = rumqttc::v5::AsyncClient::new(options, 100);
    client.subscribe(filter, rumqttc::v5::mqttbytes::QoS::AtLeastOnce).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut subscribed_tx = Some(subscribed_tx);
        while let Ok(event) = events.poll().await {
            match event {
                V5Event::Incoming(V5Packet::Publish(p)) => {
                    let _ = tx.send(p);
                }
                V5Event::Incoming(V5Packet::SubAck(_)) => {
                    if let Some(s) = subscribed_tx.take() {
                        let _ = s.send(());
                    }
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(20), subscribed).await.expect("SUBACK").unwrap();
    (client, rx)
}
