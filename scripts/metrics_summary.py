"""Summarises an edge-node (or, with --cloud, a cloud-bridge) /metrics page (Prometheus text on
stdin) for the demo."""
import sys

cloud = "--cloud" in sys.argv
lines = [l for l in sys.stdin if l.strip() and not l.startswith("#")]


def total(prefix):
    return sum(float(l.split()[-1]) for l in lines if l.startswith(prefix))


def quantile(name, q):
    buckets = []
    for l in lines:
        if l.startswith(name + "_bucket"):
            le = l.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(l.split()[-1])))
    count = total(name + "_count")
    for le, c in sorted(buckets):
        if count and c >= q * count:
            return le * 1000
    return float("nan")


if cloud:
    print(f"   cloud-bridge: {total('bridge_batches_total'):.0f} batches, {total('bridge_records_total'):.0f} records written to the sink, "
          f"{total('bridge_received_bytes_total'):.0f} bytes received; sessions refused: {total('bridge_connections_refused_total'):.0f}")
    if total("bridge_models_announced_total"):
        print(f"   cloud-bridge: {total('bridge_models_announced_total'):.0f} model versions announced, "
              f"{total('bridge_model_chunks_served_total'):.0f} chunks served ({total('bridge_model_chunk_bytes_served_total'):,.0f} bytes)")
    sys.exit(0)

clients = total("edge_mqtt_connections_total") - total('edge_mqtt_connections_total{listener="_internal"}')
print(f"   client connections accepted: {clients:.0f} (plus the built-in SLO probe)")
pub_in = total('edge_mqtt_publish_in_total') - total('edge_mqtt_publish_in_total{class="internal"}')
pub_out = total('edge_mqtt_publish_out_total{to="clients"}')
print(f"   client publishes in: {pub_in:.0f}, deliveries out: {pub_out:.0f}, refused: {total('edge_mqtt_publish_refused_total'):.0f}")
probes = total("edge_probe_latency_seconds_count")
p50 = quantile("edge_probe_latency_seconds", 0.5)
p99 = quantile("edge_probe_latency_seconds", 0.99)
lost = total("edge_probe_lost_total")
print(f"   SLO probe: {probes:.0f} QoS1 round trips, p50 <= {p50:.2f} ms, p99 <= {p99:.2f} ms (bucket bounds), lost {lost:.0f}")
up = total("edge_uplink_connected")
raw = total("edge_uplink_raw_bytes_total")
sent = total("edge_uplink_sent_bytes_total")
rtt = total("edge_uplink_rtt_seconds") * 1000
print(f"   uplink: {'connected' if up else 'down'}, {total('edge_uplink_batches_total'):.0f} batches, "
      f"{total('edge_uplink_records_total'):.0f} records, {raw:.0f} bytes before zstd, {sent:.0f} after, "
      + (f"rtt {rtt:.2f} ms" if rtt else "no ping yet"))
fetched = total("edge_model_fetched_bytes_total")
staged = total("edge_model_staged_bytes_total")
if staged:
    print(f"   models: {total('edge_model_chunks_verified_total'):.0f} chunks fetched and verified "
          f"({total('edge_model_chunks_failed_total'):.0f} refused), {fetched:,.0f} bytes fetched for "
          f"{staged:,.0f} bytes of versions staged ({fetched / staged:.2f})")
