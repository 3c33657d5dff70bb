//! Records written in the Confluent framing (`[registry] frame_classes`): a record of one of
//! those classes that its edge validated against a schema version gets, before its payload,
//! what Confluent's serializers write there (magic byte 0, the version's registry id, for
//! Protobuf the message indexes), so any Confluent deserializer reads it with the bridge as its
//! registry, on every sink alike. A payload that already starts with that framing (a device
//! that used a Confluent serializer) is left as it is.
//!
//! The framing of a version is looked up in the registry's store once (one read of every
//! version, `SchemaStore::schema_all`) and kept; an id the store does not hold is kept as
//! unknown too, so an edge stamping ids that were never registered costs one read per id, and
//! the cache is bounded (emptied past [`MAX_CACHED`]). A record whose version is unknown is
//! written as it came, and counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use shared::proto::{RecordBody, WireRecord};
use shared::schema::Schema;

use crate::sink::SchemaStore;

/// Versions whose framing is kept at most.
const MAX_CACHED: usize = 4096;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FramedLabel {
    pub outcome: &'static str,
}

shared::metrics! {
    /// How records of `frame_classes` were written.
    #[derive(Debug)]
    pub struct FrameMetrics {
        pub records: Family<FramedLabel, Counter> => (
            "registry_framed_records",
            "Records of [registry] frame_classes by outcome: framed (the Confluent framing written \
             before the payload), already (the device framed it), unknown (its schema version is \
             not in the registry: written as it came)"
        ),
    }
}

/// A version's framing by content id, from the store; `Err` when the store could not be read
/// (not kept: the next record asks again).
type Lookup = dyn Fn(String) -> BoxFuture<'static, Result<Option<Vec<u8>>, ()>> + Send + Sync;

impl std::fmt::Debug for Framer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Framer").field("classes", &self.classes).finish_non_exhaustive()
    }
}

/// See the module doc.
pub(crate) struct Framer {
    /// The classes framed; `*` for all.
    classes: Vec<String>,
    cache: Mutex<HashMap<String, Option<Arc<[u8]>>>>,
    lookup: Box<Lookup>,
    metrics: Arc<FrameMetrics>,
}

impl Framer {
    /// None when no class is framed.
    pub(crate) fn new<S: SchemaStore + 'static>(
        classes: &[String],
        store: Arc<S>,
        metrics: Arc<FrameMetrics>,
    ) -> Option<Arc<Self>> {
        if classes.is_empty() {
            return None;
        }
        let lookup = move |id: String| -> BoxFuture<'static, Result<Option<Vec<u8>>, ()>> {
            let store = store.clone();
            Box::pin(async move {
                let all = match super::all_versions(&*store).await {
                    Ok(all) => all,
                    Err(e) => {
                        tracing::warn!(error = %e, "registry: versions not read; records go unframed until they are");
                        return Err(());
                    }
                };
                let Some(v) = all.into_iter().find(|v| v.id == id) else { return Ok(None) };
                let number = v.registry_id();
                Ok(Schema::parse(v.source).ok().map(|s| s.confluent_prefix(number)))
            })
        };
        Some(Arc::new(Self { classes: classes.to_vec(), cache: Mutex::default(), lookup: Box::new(lookup), metrics }))
    }

    fn frames(&self, class: &str) -> bool {
        self.classes.iter().any(|c| c == "*" || c == class)
    }

    /// The framing of the version with content id `id`, looked up once.
    async fn prefix(&self, id: &str) -> Option<Arc<[u8]>> {
        if let Some(known) = self.cache.lock().unwrap_or_else(PoisonError::into_inner).get(id) {
            return known.clone();
        }
        // A store that could not be read is asked again by the next record, not taken as an
        // unknown version for good.
        let found: Option<Arc<[u8]>> = (self.lookup)(id.to_owned()).await.ok()?.map(Into::into);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(id.to_owned(), found.clone());
        found
    }

    /// Writes the framing before each payload of a framed class that a schema version
    /// validated; returns the bytes added.
    pub(crate) async fn frame(&self, records: &mut [WireRecord]) -> usize {
        let mut added = 0;
        for r in records {
            let RecordBody::Message(m) = &mut r.body else { continue };
            let Some(schema) = &m.schema else { continue };
            if !self.frames(&m.class) {
                continue;
            }
            let outcome = match self.prefix(&schema.id).await {
                Some(p) if m.payload.starts_with(&p[..5]) => "already",
                Some(p) => {
                    m.payload.splice(0..0, p.iter().copied());
                    added += p.len();
                    "framed"
                }
                None => "unknown",
            };
            self.metrics.records.get_or_create(&FramedLabel { outcome }).inc();
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::proto::{SchemaRef, Seq, WireMessage};

    fn record(class: &str, payload: &[u8], schema: Option<&str>) -> WireRecord {
        let schema = schema.map(|id| SchemaRef { subject: "s".into(), version: 1, id: id.into() });
        let message = WireMessage {
            class: class.into(),
            topic: "t".into(),
            payload: payload.to_vec(),
            qos: 1,
            enqueued_ms: 0,
            expires_ms: None,
            user_properties: Vec::new(),
            correlation_data: None,
            content_type: None,
            schema,
        };
        WireRecord::message(Seq(1), message)
    }

    fn payload(r: &WireRecord) -> &[u8] {
        let RecordBody::Message(m) = &r.body else { unreachable!() };
        &m.payload
    }

    /// Framed: only the classes named, only records a version validated; a payload the device
    /// framed is left alone; an unknown version is written as it came, looked up once.
    #[tokio::test]
    async fn records_of_the_classes_named_get_their_versions_framing_once() {
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        let framer = Framer {
            classes: vec!["plant".into()],
            cache: Mutex::default(),
            lookup: Box::new(move |id| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Box::pin(async move { Ok((id == "aa").then(|| vec![0, 0, 0, 0, 9])) })
            }),
            metrics: Arc::default(),
        };
        let mut records = vec![
            record("plant", b"\x02\x04", Some("aa")),
            record("plant", b"\x00\x00\x00\x00\x09\x02", Some("aa")),
            record("vision", b"\x02", Some("aa")),
            record("plant", b"{}", None),
            record("plant", b"\x06", Some("bb")),
            record("plant", b"\x08", Some("bb")),
        ];
        assert_eq!(framer.frame(&mut records).await, 5);
        let got: Vec<&[u8]> = records.iter().map(payload).collect();
        assert_eq!(
            got,
            [&b"\x00\x00\x00\x00\x09\x02\x04"[..], b"\x00\x00\x00\x00\x09\x02", b"\x02", b"{}", b"\x06", b"\x08"]
        );
        assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 2, "each id looked up once, unknown too");
        let count = |outcome| framer.metrics.records.get_or_create(&FramedLabel { outcome }).get();
        assert_eq!((count("framed"), count("already"), count("unknown")), (1, 1, 2));
    }
}
