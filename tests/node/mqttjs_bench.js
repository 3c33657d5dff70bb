// Local-latency load with MQTT.js and its defaults (Nagle's algorithm on over TCP): one
// connection that subscribes and publishes QoS 1, 1 KiB payloads carrying a sequence number and
// a send time, as a Node app or a browser HMI does. RATE 0 publishes as fast as PUBACKs allow
// with 100 in flight. Prints one JSON line in mqtt-bench's format (scripts/bench-local.sh).
//
// Usage: node mqttjs_bench.js URL RATE SECONDS LABEL GENERATOR
//   URL: mqtt://127.0.0.1:1883 or ws://127.0.0.1:8083/mqtt
'use strict';
const mqtt = require('mqtt');

const [url, rateArg, secondsArg, label, generator] = process.argv.slice(2);
const rate = Number(rateArg);
const seconds = Number(secondsArg);
const warmupNs = 1_000_000_000n;
const base = process.hrtime.bigint();
const now = () => process.hrtime.bigint() - base;
const topic = `mqttjs-bench/${base}`;
const latencies = [];
const seen = new Set();
let duplicates = 0;
let windowStart = null;
let windowEnd = null;
let seq = 0;
let measuredSent = 0;
let inFlight = 0;
const payload = Buffer.alloc(1024);

const client = mqtt.connect(url, { clientId: `mqttjs-${base}`, protocolVersion: 5, clean: true, reconnectPeriod: 0 });
client.on('error', (e) => {
  console.error(`mqttjs_bench: ${e.message}`);
  process.exit(1);
});
client.on('message', (_topic, message) => {
  const at = now();
  const s = Number(message.readBigUInt64BE(0));
  const sent = message.readBigUInt64BE(8);
  if (seen.has(s)) {
    duplicates += 1;
    return;
  }
  seen.add(s);
  if (sent >= warmupNs) {
    const t = Date.now();
    if (windowStart === null) windowStart = t;
    windowEnd = t;
    latencies.push(Number((at - sent) / 1000n));
  }
});

function publishOne() {
  const sentAt = now();
  payload.writeBigUInt64BE(BigInt(seq), 0);
  payload.writeBigUInt64BE(sentAt, 8);
  if (sentAt >= warmupNs) measuredSent += 1;
  seq += 1;
  inFlight += 1;
  // A copy: MQTT.js may hold the buffer until it is written.
  client.publish(topic, Buffer.from(payload), { qos: 1 }, () => {
    inFlight -= 1;
    if (rate === 0 && !stopped) publishOne();
  });
}

let stopped = false;
const totalNs = warmupNs + BigInt(Math.round(seconds * 1e9));

client.on('connect', () => {
  client.subscribe(topic, { qos: 1 }, (err) => {
    if (err) {
      console.error(`mqttjs_bench: subscribe: ${err.message}`);
      process.exit(1);
    }
    const started = now();
    if (rate === 0) {
      for (let i = 0; i < 100; i += 1) publishOne();
    } else {
      const tick = setInterval(() => {
        const elapsed = now() - started;
        if (elapsed >= totalNs) return;
        const due = Math.floor((Number(elapsed) / 1e9) * rate);
        while (seq < due) publishOne();
      }, 1);
      setTimeout(() => clearInterval(tick), Number(totalNs / 1_000_000n));
    }
    setTimeout(() => {
      stopped = true;
      const deadline = Date.now() + 3000;
      const finish = () => {
        if (seen.size < seq && Date.now() < deadline) return setTimeout(finish, 50);
        report();
      };
      finish();
    }, Number(totalNs / 1_000_000n));
  });
});

function report() {
  latencies.sort((a, b) => a - b);
  const pct = (q) => (latencies.length ? latencies[Math.min(Math.floor(latencies.length * q), latencies.length - 1)] : 0);
  const span = windowStart !== null ? (windowEnd - windowStart) / 1000 : 0;
  console.log(
    JSON.stringify({
      label,
      rate,
      payload: 1024,
      subscribers: 1,
      sent: measuredSent,
      received: latencies.length,
      lost: Math.max(measuredSent - latencies.length, 0),
      received_total: seen.size,
      sent_total: seq,
      duplicates,
      p50_us: pct(0.5),
      p99_us: pct(0.99),
      max_us: latencies.length ? latencies[latencies.length - 1] : 0,
      achieved_rate: span > 0 ? latencies.length / span : 0,
      in_flight_at_end: inFlight,
      generator,
    }),
  );
  client.end(true, () => process.exit(0));
}
