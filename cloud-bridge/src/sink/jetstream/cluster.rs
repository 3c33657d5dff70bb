//! A JetStream sink on a cluster: several servers to connect to, replicas chosen on purpose,
//! and a start that waits out a cluster still electing its leaders.
//!
//! - `url` names one server or several, comma-separated (any of a cluster's): the client takes
//!   the first that answers and moves to another when it goes away.
//! - `replicas` is required on a clustered server: an R1 stream there loses acknowledged
//!   records with one disk, and the cluster's size as the client sees it at start is only the
//!   servers it has routes to so far, so it is not guessed. On a single server it is 1.
//! - An existing stream or bucket with other replicas is scaled to the configured number
//!   (JetStream moves the data), or the start is refused naming both numbers.
//! - Connecting and the first JetStream requests are retried with backoff for
//!   `startup_retry`: a bridge started with a server down, or just as the cluster elected its
//!   meta leader, starts once the cluster answers.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};

use crate::sink::SinkError;

/// The servers in `url`: one or several, comma-separated.
pub(crate) fn servers(url: &str) -> Result<Vec<async_nats::ServerAddr>, SinkError> {
    let list: Vec<&str> = url.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if list.is_empty() {
        return Err(SinkError::Invalid { what: "connect", reason: "sink.url names no server".into() });
    }
    list.iter()
        .map(|s| {
            s.parse::<async_nats::ServerAddr>().map_err(|e| SinkError::Invalid {
                what: "connect",
                reason: format!("sink.url: {s:?} is not a NATS server address: {e}"),
            })
        })
        .collect()
}

/// A client of the servers in `url`, trying them all, again and again with backoff, for
/// `within`.
pub async fn connect(url: &str, within: Duration) -> Result<async_nats::Client, SinkError> {
    let addrs = servers(url)?;
    retrying("connect", within, || {
        let addrs = addrs.clone();
        async move {
            async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(3))
                .connect(addrs)
                .await
                .map_err(|e| SinkError::nats("connect", url, &e))
        }
    })
    .await
}

/// Runs `attempt` until it succeeds, fails for good (not [`SinkError::Unavailable`] or a
/// JetStream error the cluster gives while it elects), or `within` has passed.
pub(crate) async fn retrying<T, F, Fut>(what: &'static str, within: Duration, mut attempt: F) -> Result<T, SinkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SinkError>>,
{
    let deadline = Instant::now() + within;
    let mut wait = Duration::from_millis(250);
    loop {
        match attempt().await {
            Ok(t) => return Ok(t),
            Err(e) if passing(&e) && Instant::now() + wait < deadline => {
                tracing::warn!(what, error = %e, retry_in = %shared::units::HumanDuration(wait), "sink not ready; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether `e` may pass by itself: no answer, or JetStream not ready (no meta leader, stream
/// offline, JetStream not enabled yet: codes 10008, 10118 and the like answer with a 503).
fn passing(e: &SinkError) -> bool {
    match e {
        SinkError::Unavailable { .. } => true,
        SinkError::JetStream { code, reason, .. } => {
            matches!(code, Some(10008 | 10118 | 10039)) || reason.contains("timed out") || reason.contains("503")
        }
        _ => false,
    }
}

/// The replicas to use: the configured number, or 1 on a server that is not clustered.
pub(crate) fn replicas(configured: Option<usize>, info: &async_nats::ServerInfo) -> Result<usize, SinkError> {
    match (configured, &info.cluster) {
        (Some(n), _) if (1..=5).contains(&n) => Ok(n),
        (Some(n), _) => {
            Err(SinkError::Invalid { what: "replicas", reason: format!("sink.replicas = {n}: use 1 to 5") })
        }
        (None, None) => Ok(1),
        (None, Some(cluster)) => {
            let known = info.connect_urls.len().max(1);
            Err(SinkError::Invalid {
                what: "replicas",
                reason: format!(
                    "the NATS server is in cluster {cluster:?} ({known} servers known to it): set sink.replicas \
                     (3 keeps every acknowledged record through the loss of a server; 1 loses them with one disk)"
                ),
            })
        }
    }
}

/// Makes the existing stream `name` (`what` it is, for messages) have `want` replicas: scaled
/// if it has others, or the reason it cannot be.
pub(crate) async fn ensure_replicas(
    js: &jetstream::Context,
    what: &'static str,
    name: &str,
    config: &stream::Config,
    want: usize,
) -> Result<(), SinkError> {
    let have = config.num_replicas.max(1);
    if have == want {
        return Ok(());
    }
    let scaled = stream::Config { num_replicas: want, ..config.clone() };
    match js.update_stream(scaled).await {
        Ok(_) => {
            tracing::warn!(what, name, from = have, to = want, "scaled to the configured replicas");
            Ok(())
        }
        Err(e) => Err(SinkError::Invalid {
            what,
            reason: format!(
                "{name} has {have} replicas and sink.replicas is {want}; scaling it failed: {e} \
                 (scale it with `nats stream edit {name} --replicas {want}`, or set sink.replicas = {have})"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_servers_parses_and_a_bad_entry_is_named() {
        assert_eq!(servers("nats://a:4222, nats://b:4223,").unwrap().len(), 2);
        assert_eq!(servers("127.0.0.1:4222").unwrap().len(), 1);
        let e = servers("nats://a:4222,nats://b:notaport").unwrap_err().to_string();
        assert!(e.contains("\"nats://b:notaport\" is not a NATS server address"), "{e}");
        assert!(servers(" , ").is_err());
    }

    #[test]
    fn replicas_are_required_on_a_cluster_and_one_on_a_single_server() {
        let single = async_nats::ServerInfo::default();
        assert_eq!(replicas(None, &single).unwrap(), 1);
        let clustered = async_nats::ServerInfo {
            cluster: Some("east".into()),
            connect_urls: vec!["a:4222".into(), "b:4222".into(), "c:4222".into()],
            ..Default::default()
        };
        let e = replicas(None, &clustered).unwrap_err().to_string();
        assert!(e.contains("cluster \"east\" (3 servers known to it): set sink.replicas"), "{e}");
        assert_eq!(replicas(Some(3), &clustered).unwrap(), 3);
        assert!(replicas(Some(0), &single).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn retries_wait_out_what_passes_and_stop_at_what_does_not() {
        let mut calls = 0;
        let done = retrying("t", Duration::from_secs(10), || {
            calls += 1;
            let n = calls;
            async move { if n < 3 { Err(SinkError::Unavailable { what: "t", reason: "down".into() }) } else { Ok(n) } }
        })
        .await;
        assert_eq!(done.unwrap(), 3);
        let mut calls = 0;
        let refused: Result<(), _> = retrying("t", Duration::from_secs(10), || {
            calls += 1;
            async { Err(SinkError::Invalid { what: "t", reason: "no".into() }) }
        })
        .await;
        assert!(refused.is_err());
        assert_eq!(calls, 1, "what does not pass is not retried");
        let gave_up: Result<(), _> = retrying("t", Duration::from_secs(2), || async {
            Err(SinkError::Unavailable { what: "t", reason: "x".into() })
        })
        .await;
        assert!(gave_up.is_err());
    }
}
