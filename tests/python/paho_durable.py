"""paho-mqtt (MQTT 5, persistent sessions) against a node that is killed and restarted under it.

Usage:
  paho_durable.py subscribe HOST PORT         make the subscriber's session (QoS 2 on durable/#)
                                              and leave; prints "ok"
  paho_durable.py publish HOST PORT COUNT     publish COUNT messages, even ids at QoS 1 and odd
                                              at QoS 2, reconnecting whenever the node goes away;
                                              prints "progress N" as acknowledgements come, then
                                              a JSON line {"acked": [ids], "unacked": [ids],
                                              "failed": [[id, reason]]}
  paho_durable.py collect HOST PORT QUIET     resume the subscriber's session and take what
                                              comes (reconnecting whenever the node goes away)
                                              until QUIET seconds pass without a message after the
                                              first;
                                              prints a JSON line {"present": bool, "got": [[id,
                                              qos, dup], ...]}

Both clients keep their sessions (Session Expiry one hour, Clean Start 0 after the first
connect), so paho resends what was in flight after each reconnect, with DUP, and the broker's
stored QoS 2 ids keep a resent QoS 2 message from arriving twice (with paho's own resend bug
worked around: `keep_released`).
"""
import json
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
TOPIC = "durable"


def keep_released(client):
    """Works around paho-mqtt 2.2.0 breaking [MQTT-4.3.3-5] ("MUST NOT re-send the PUBLISH once
    it has sent the corresponding PUBREL"). Each reconnect attempt resets the in-flight
    messages: the first turns a QoS 2 message waiting for PUBCOMP into "resend PUBREL", and a
    second attempt (the first refused while the node restarts) turns that into "publish", so
    paho sends the message again as a new one (DUP 0) once connected. A broker that had released
    the id rightly takes it as a new message, and the subscriber gets it twice (seen in CI).
    Here a message paho was to resend PUBREL for stays so."""
    reset = client._messages_reconnect_reset_out

    def patched():
        with client._out_message_mutex:
            releasing = [m for m in client._out_messages.values() if m.state == mqtt.mqtt_ms_resend_pubrel]
        reset()
        with client._out_message_mutex:
            for m in releasing:
                m.state = mqtt.mqtt_ms_resend_pubrel

    client._messages_reconnect_reset_out = patched


def props(expiry=3600):
    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = expiry
    return p


def make(client_id):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.reconnect_delay_set(min_delay=0.05, max_delay=0.5)
    # Everything paho holds goes when the broker is back: no cap on what waits meanwhile.
    c.max_inflight_messages_set(64)
    return c


def subscribe():
    c = make("durable-sub")
    subscribed = threading.Event()
    c.on_subscribe = lambda *a: subscribed.set()
    c.connect(host, port, keepalive=30, clean_start=True, properties=props())
    c.loop_start()
    c.subscribe(f"{TOPIC}/#", qos=2)
    if not subscribed.wait(10):
        print("no SUBACK")
        sys.exit(1)
    c.disconnect()
    c.loop_stop()
    print("ok")


def publish(count):
    c = make("durable-pub")
    keep_released(c)
    lock = threading.Condition()
    pending = {}
    acked = []
    connected = threading.Event()

    def on_connect(client, userdata, flags, reason, properties):
        if not reason.is_failure:
            connected.set()

    def on_disconnect(client, userdata, flags, reason, properties):
        connected.clear()

    # Acknowledgements that came before publish() returned the message's id.
    early = {}

    failed = []

    def ack(i, reason):
        # A PUBREL resent after a restart whose first PUBCOMP the stop cut off is answered
        # 0x92, "not an error during recovery" (MQTT 5 reason codes): the PUBREC before it
        # acknowledged the message, which the broker released.
        if reason.is_failure and reason.value != 0x92:
            failed.append([i, str(reason)])
        else:
            acked.append(i)
            if len(acked) % 250 == 0:
                print(f"progress {len(acked)}", flush=True)

    def on_publish(client, userdata, mid, reason, properties):
        with lock:
            i = pending.pop(mid, None)
            if i is None:
                early[mid] = reason
            else:
                ack(i, reason)
            lock.notify_all()

    c.on_connect = on_connect
    c.on_disconnect = on_disconnect
    c.on_publish = on_publish
    # Clean Start on the first connect only: each reconnect resumes the session, whose QoS 2 ids
    # the broker keeps.
    c.connect(host, port, keepalive=5, clean_start=mqtt.MQTT_CLEAN_START_FIRST_ONLY, properties=props())
    c.loop_start()
    if not connected.wait(10):
        print("no CONNACK")
        sys.exit(1)
    for i in range(count):
        with lock:
            while len(pending) >= 64:
                lock.wait(1)
        # Not under our lock: paho calls on_publish holding its own, which publish() takes.
        info = c.publish(f"{TOPIC}/{i % 7}", payload=str(i), qos=1 if i % 2 == 0 else 2)
        with lock:
            if info.mid in early:
                ack(i, early.pop(info.mid))
            else:
                pending[info.mid] = i
    deadline = time.time() + 120
    with lock:
        while pending and time.time() < deadline:
            lock.wait(1)
    c.disconnect()
    c.loop_stop()
    print(json.dumps({"acked": acked, "unacked": sorted(pending.values()), "failed": failed}), flush=True)


def collect(quiet):
    c = make("durable-sub")
    got = []
    last = [time.time()]
    present = []

    def on_connect(client, userdata, flags, reason, properties):
        present.append(flags.session_present)

    def on_message(client, userdata, msg):
        got.append([int(msg.payload), msg.qos, bool(msg.dup)])
        last[0] = time.time()

    c.on_connect = on_connect
    c.on_message = on_message
    c.connect(host, port, keepalive=5, clean_start=False, properties=props())
    c.loop_start()
    while not got or time.time() - last[0] < quiet:
        time.sleep(0.1)
    c.disconnect()
    c.loop_stop()
    print(json.dumps({"present": bool(present and present[0]), "got": got}), flush=True)


if mode == "subscribe":
    subscribe()
elif mode == "publish":
    publish(int(sys.argv[4]))
elif mode == "collect":
    collect(float(sys.argv[4]))
else:
    print(f"unknown mode {mode}")
    sys.exit(2)
