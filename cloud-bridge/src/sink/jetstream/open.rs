//! Opening the JetStream sink: connecting, then the records' stream, the buckets and the
//! downlink's stream, each made if missing and checked if present.

use std::time::Duration;

use async_nats::jetstream::{self, stream};

use super::bucket::bucket;
use super::publish::{BatchPublish, Publishing};
use super::{JetStreamSettings, JetStreamSink, JsDown, cluster};
use crate::sink::error::SinkError;
use crate::sink::quota::EdgeQuota;

/// Dictionaries not stored again for this long expire. An edge names the ones it uses in every
/// hello and announces again any the bridge no longer has, so expiry only bounds the bucket
/// (of dictionaries stored before they were per edge, too).
const DICT_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

impl JetStreamSink {
    /// Connects to the servers in `s.url` and opens (or creates) the stream and the buckets,
    /// retrying what a cluster still starting answers for `s.startup_retry`.
    pub async fn connect(s: &JetStreamSettings) -> Result<Self, SinkError> {
        let client = cluster::connect(&s.url, s.startup_retry).await?;
        let replicas = cluster::replicas(s.replicas, &client.server_info())?;
        cluster::retrying("start", s.startup_retry, || Box::pin(Self::open(client.clone(), s, replicas))).await
    }

    async fn open(client: async_nats::Client, s: &JetStreamSettings, replicas: usize) -> Result<Self, SinkError> {
        let version = client.server_info().version;
        let js = jetstream::new(client.clone());
        let subjects = format!("{}.>", s.subject_prefix);
        let publishing = Publishing::choose(s.batches, &version);
        if !matches!(
            (s.batches, publishing),
            (BatchPublish::Auto | BatchPublish::Off, _)
                | (BatchPublish::Fast, Publishing::Fast)
                | (BatchPublish::Atomic, Publishing::Atomic)
        ) {
            tracing::warn!(
                version,
                wanted = s.batches.name(),
                using = publishing.name(),
                "nats-server lacks the batch publishing asked for"
            );
        }
        let (fast, atomic) = (publishing == Publishing::Fast, publishing == Publishing::Atomic);
        let mut stream = js
            .get_or_create_stream(stream::Config {
                name: s.stream.clone(),
                subjects: vec![subjects.clone()],
                duplicate_window: s.duplicate_window,
                num_replicas: replicas,
                allow_atomic_publish: atomic,
                allow_batch_publish: fast,
                ..Default::default()
            })
            .await
            .map_err(|e| SinkError::nats("stream", &s.stream, &e))?;
        let info = stream.info().await.map_err(|e| SinkError::nats("stream", &s.stream, &e))?.clone();
        if !info.config.subjects.contains(&subjects) {
            return Err(SinkError::invalid(
                "stream",
                format!("{} exists with subjects {:?}, not {subjects:?}", s.stream, info.config.subjects),
            ));
        }

        // Allowing either kind of batch changes nothing for the stream's other publishers.
        if (atomic && !info.config.allow_atomic_publish) || (fast && !info.config.allow_batch_publish) {
            let config = stream::Config {
                allow_atomic_publish: atomic || info.config.allow_atomic_publish,
                allow_batch_publish: fast || info.config.allow_batch_publish,
                ..info.config.clone()
            };
            js.update_stream(config)
                .await
                .map_err(|e| SinkError::nats("stream", &format!("{}: allow batches", s.stream), &e))?;
            tracing::info!(stream = s.stream, publishing = publishing.name(), "stream now allows batches");
        }
        let config = stream.info().await.map_err(|e| SinkError::nats("stream", &s.stream, &e))?.config.clone();
        cluster::ensure_replicas(&js, "stream", &s.stream, &config, replicas).await?;
        let max_msg_size = usize::try_from(info.config.max_message_size).ok().filter(|n| *n > 0);
        let marks = bucket(&js, "marks bucket", &s.marks_bucket, replicas, Duration::ZERO).await?;
        let dicts = bucket(&js, "dictionary bucket", &s.dicts_bucket, replicas, DICT_MAX_AGE).await?;
        let reports = bucket(&js, "TCO report bucket", &s.tco_bucket, replicas, Duration::ZERO).await?;
        let fleet = bucket(&js, "fleet bucket", &s.fleet_bucket, replicas, Duration::ZERO).await?;
        let schemas = bucket(&js, "schema bucket", &s.schemas_bucket, replicas, Duration::ZERO).await?;
        let down = open_down(&js, s, replicas).await?;
        Ok(Self {
            js,
            publishing,
            marks,
            last_marks: Default::default(),
            dicts,
            reports,
            fleet,
            schemas,
            prefix: s.subject_prefix.clone(),
            stream: s.stream.clone(),
            max_payload: client.server_info().max_payload,
            max_msg_size,
            metrics: Default::default(),
            quota: EdgeQuota::default(),
            down: std::sync::Arc::new(down),
            client,
        })
    }
}

/// Opens (or creates) the downlink's stream and bucket; `uplink_prefix` must not overlap.
async fn open_down(
    js: &jetstream::Context,
    settings: &JetStreamSettings,
    replicas: usize,
) -> Result<JsDown, SinkError> {
    let (s, uplink_stream, uplink_prefix) = (&settings.down, &settings.stream, &settings.subject_prefix);
    let duplicate_window = settings.duplicate_window;
    let overlaps = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}."));
    if overlaps(&s.subject_prefix, uplink_prefix) || overlaps(uplink_prefix, &s.subject_prefix) {
        return Err(SinkError::invalid(
            "downlink stream",
            format!("down_subject_prefix {:?} overlaps subject_prefix {uplink_prefix:?}", s.subject_prefix),
        ));
    }
    let subjects = format!("{}.>", s.subject_prefix);
    let mut stream = js
        .get_or_create_stream(stream::Config {
            name: s.stream.clone(),
            subjects: vec![subjects.clone()],
            duplicate_window,
            max_age: s.max_age.0,
            num_replicas: replicas,
            ..Default::default()
        })
        .await
        .map_err(|e| SinkError::nats("downlink stream", &s.stream, &e))?;
    let config = stream.info().await.map_err(|e| SinkError::nats("downlink stream", &s.stream, &e))?.config.clone();
    if !config.subjects.contains(&subjects) {
        return Err(SinkError::invalid(
            "downlink stream",
            format!("{} exists with subjects {:?}, not {subjects:?}", s.stream, config.subjects),
        ));
    }
    cluster::ensure_replicas(js, "downlink stream", &s.stream, &config, replicas).await?;
    let positions = bucket(js, "downlink bucket", &s.bucket, replicas, Duration::ZERO).await?;
    let uplink = js.get_stream(uplink_stream).await.map_err(|e| SinkError::nats("stream", uplink_stream, &e))?;
    let guarded = version_at_least(&js.client().server_info().version, (2, 11));
    if !guarded {
        tracing::warn!(
            version = js.client().server_info().version,
            "nats-server before 2.11: sends racing for an edge's last backlog room may both take it (the summary's trim sets the newest aside)"
        );
    }
    Ok(JsDown {
        js: js.clone(),
        stream,
        name: s.stream.clone(),
        max_payload: js.client().server_info().max_payload as u64,
        max_msg_size: u64::try_from(config.max_message_size).ok().filter(|m| *m > 0),
        guarded,
        prefix: s.subject_prefix.clone(),
        positions,
        uplink,
        uplink_prefix: uplink_prefix.to_owned(),
        url: settings.url.clone(),
        hints: std::sync::OnceLock::new(),
        ahead: super::downlink::ReadAhead::new(s.read_ahead_bytes.bytes()),
    })
}

fn version_at_least(version: &str, at: (u64, u64)) -> bool {
    let mut parts = version.split(['.', '-']).map(|p| p.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= at
}
