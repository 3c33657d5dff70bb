//! Counting what rumqttd only logs.
//!
//! rumqttd keeps a bounded log per filter and moves a subscriber that fell behind it to the
//! oldest message still held ("cursor jump"); the messages in between are lost for that
//! subscriber. Its alert channel for this is flushed only by a timer that `Broker::start` owns,
//! which the embedded setup does not use, so the one trace of a jump is a WARN event. This
//! tracing layer counts those events, with its own filter so the user's log level does not hide
//! them. The match is on rumqttd 0.20's message text; the slow-subscriber test fails if a
//! rumqttd upgrade changes it. Each node reports the jumps since it started as
//! `edge_mqtt_slow_subscriber_skips_total`, read at every scrape.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{Filtered, Targets};
use tracing_subscriber::layer::Context;

static CURSOR_JUMPS: AtomicU64 = AtomicU64::new(0);

/// Cursor jumps seen in this process since it started.
pub fn cursor_jumps() -> u64 {
    CURSOR_JUMPS.load(Ordering::Relaxed)
}

#[derive(Debug)]
pub struct SkipCounter;

/// The layer to add to the process's tracing subscriber.
pub fn layer<S>() -> Filtered<SkipCounter, Targets, S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    SkipCounter.with_filter(Targets::new().with_target("rumqttd::router::routing", tracing::Level::WARN))
}

struct JumpMessage(bool);

impl Visit for JumpMessage {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "error" && value.starts_with("Read cursor start jumped") {
            self.0 = true;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "error" && format!("{value:?}").contains("Read cursor start jumped") {
            self.0 = true;
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for SkipCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut visitor = JumpMessage(false);
        event.record(&mut visitor);
        if visitor.0 {
            CURSOR_JUMPS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The jumps since a node registered its metrics, counted at each scrape.
#[derive(Debug)]
struct Skips {
    baseline: u64,
}

impl Collector for Skips {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counter = ConstCounter::new(cursor_jumps().saturating_sub(self.baseline));
        let metric = encoder.encode_descriptor(
            "mqtt_slow_subscriber_skips",
            "Times a subscriber fell further behind than the broker's bounded backlog (segment_size x segment_count) and skipped messages; each skip loses one or more messages for that subscriber.",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

/// Registers the node's slow-subscriber skip counter.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(Skips { baseline: cursor_jumps() }));
}
