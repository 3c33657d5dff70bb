"""confluent-kafka (Confluent's Python client on its own librdkafka) as a user of the Kafka sink
would run it, against the sink's topics.

Usage:
  kafka_client.py read BOOTSTRAP TOPIC ISOLATION   every record of TOPIC (all partitions, from
                                                   the start, up to the end offsets it finds) read
                                                   with isolation.level ISOLATION
                                                   (read_committed or read_uncommitted); prints a
                                                   JSON list of {partition, offset, key, headers,
                                                   value} (key and value as text)
  kafka_client.py zombie BOOTSTRAP TXN_ID TOPIC PARTITION MARKS_TOPIC MARK_KEY FIRST LAST
                                                   a bridge that dies mid-batch: opens producer
                                                   TXN_ID, begins a transaction with records
                                                   FIRST..=LAST (value "zombie-<seq>", header
                                                   Edge-Seq) and the mark MARK_KEY=LAST, flushes
                                                   them to the brokers, prints "open" and waits
                                                   to be killed without committing
  kafka_client.py produce BOOTSTRAP TOPIC          a producer of someone else's: one record per
                                                   JSON line on stdin, {key, value, headers:
                                                   [[name, value]], partition (optional)},
                                                   partitioned as the Java client does
                                                   (murmur2_random); prints a JSON list of
                                                   [partition, offset]
"""
import json
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def text(b):
    return None if b is None else b.decode("utf-8", "replace")


def read(bootstrap, topic, isolation):
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "test-reader",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "enable.partition.eof": True,
    })
    # A topic just made may be listed before its partitions have leaders: asked until they do.
    deadline = time.time() + 30
    while True:
        meta = c.list_topics(topic, timeout=30).topics[topic]
        if meta.error is None and meta.partitions and all(p.leader >= 0 for p in meta.partitions.values()):
            break
        if time.time() > deadline:
            raise SystemExit(f"{topic}: no leaders: {meta.error}")
        time.sleep(0.2)
    parts = sorted(meta.partitions)
    ends = {}
    for p in parts:
        low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        ends[p] = high
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out = []
    done = {p for p in parts if ends[p] == 0}
    deadline = time.time() + 60
    while len(done) < len(parts) and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == -191:  # _PARTITION_EOF
                done.add(m.partition())
                continue
            raise SystemExit(f"consume: {m.error()}")
        out.append({
            "partition": m.partition(),
            "offset": m.offset(),
            "key": text(m.key()),
            "headers": {k: text(v) for k, v in (m.headers() or [])},
            "value": text(m.value()),
        })
    c.close()
    print(json.dumps(out))


def zombie(bootstrap, txn_id, topic, partition, marks_topic, mark_key, first, last, hold=None):
    # murmur2_random: the Java client's partitioner, which the sink uses for its keys too.
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 60000,
                  "partitioner": "murmur2_random"})
    p.init_transactions(30)
    p.begin_transaction()
    for seq in range(first, last + 1):
        p.produce(topic, value=f"zombie-{seq}", key="zombie", partition=partition,
                  headers=[("Edge-Seq", f"zombie:{seq}")])
    p.produce(marks_topic, value=str(last), key=mark_key)
    p.flush(30)
    print("open", flush=True)
    if hold is None:
        time.sleep(3600)
    # A producer that is slow, not dead: it ends its transaction itself, aborted.
    time.sleep(float(hold))
    p.abort_transaction(30)
    print("aborted", flush=True)


def produce(bootstrap, topic):
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "acks": "all"})
    out = []

    def done(err, m):
        if err is not None:
            raise SystemExit(f"produce: {err}")
        out.append([m.partition(), m.offset()])

    for line in sys.stdin:
        if not line.strip():
            continue
        r = json.loads(line)
        extra = {"partition": r["partition"]} if "partition" in r else {}
        headers = [(k, v.encode()) for k, v in r.get("headers", [])]
        p.produce(topic, value=r["value"].encode(), key=r["key"].encode(), headers=headers, on_delivery=done, **extra)
        # One at a time: the offsets come back in the order written.
        p.flush(30)
    print(json.dumps(out))


mode = sys.argv[1]
if mode == "read":
    read(sys.argv[2], sys.argv[3], sys.argv[4])
elif mode == "zombie":
    a = sys.argv
    zombie(a[2], a[3], a[4], int(a[5]), a[6], a[7], int(a[8]), int(a[9]), a[10] if len(a) > 10 else None)
elif mode == "produce":
    produce(sys.argv[2], sys.argv[3])
else:
    raise SystemExit(f"unknown mode {mode}")
