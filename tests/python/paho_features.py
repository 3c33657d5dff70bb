"""MQTT 5 features of the edge broker through paho-mqtt: persistent sessions across reconnect,
shared subscriptions, No Local, Retain Handling, Message Expiry, wills with a delay, and the
bounds a client hears about (subscriptions, topic length).

Usage: paho_features.py HOST PORT [tcp|websockets [PATH [CA_FILE]]]. With CA_FILE the
connection is TLS (wss for websockets), verified against it. Each check prints "ok NAME" or
"FAIL NAME: why"; the exit status is 1 if any failed. The broker is expected to run with
broker.max_subscriptions = 4 and broker.max_topic_length = 64.
"""
import sys
import threading
import time
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

host, port = sys.argv[1], int(sys.argv[2])
transport = sys.argv[3] if len(sys.argv) > 3 else "tcp"
ws_path = sys.argv[4] if len(sys.argv) > 4 else "/mqtt"
ca_file = sys.argv[5] if len(sys.argv) > 5 else None
run = uuid.uuid4().hex[:8]
failures = []
WAIT = 5


class Conn:
    """A connected paho client that collects what it receives."""

    def __init__(self, name, clean_start=True, expiry=None, will=None):
        self.messages = []
        self.got = threading.Condition()
        self.connack = threading.Event()
        self.suback = threading.Event()
        self.suback_codes = []
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-{run}", protocol=mqtt.MQTTv5, transport=transport
        )
        if transport == "websockets":
            self.client.ws_set_options(path=ws_path)
        if ca_file is not None:
            self.client.tls_set(ca_certs=ca_file)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        if will is not None:
            topic, payload, delay = will
            props = Properties(PacketTypes.WILLMESSAGE)
            props.WillDelayInterval = delay
            self.client.will_set(topic, payload, qos=1, properties=props)
        props = Properties(PacketTypes.CONNECT)
        if expiry is not None:
            props.SessionExpiryInterval = expiry
        self.client.connect(host, port, keepalive=30, clean_start=clean_start, properties=props)
        self.client.loop_start()
        if not self.connack.wait(WAIT):
            raise RuntimeError(f"{name}: no CONNACK")

    def _on_connect(self, client, userdata, flags, reason, props):
        self.session_present = flags.session_present
        self.reason = reason
        self.connack.set()

    def _on_message(self, client, userdata, msg):
        with self.got:
            self.messages.append(msg)
            self.got.notify_all()

    def _on_subscribe(self, client, userdata, mid, reasons, props):
        self.suback_codes = [r.value for r in reasons]
        self.suback.set()

    def subscribe(self, filter_, qos=1, **options):
        self.suback.clear()
        self.client.subscribe(filter_, options=SubscribeOptions(qos=qos, **options))
        if not self.suback.wait(WAIT):
            raise RuntimeError(f"no SUBACK for {filter_}")
        return self.suback_codes

    def wait_for(self, count, timeout=WAIT):
        deadline = time.monotonic() + timeout
        with self.got:
            while len(self.messages) < count and time.monotonic() < deadline:
                self.got.wait(0.05)
            return list(self.messages)

    def payloads(self):
        with self.got:
            return [m.payload.decode() for m in self.messages]

    def close(self):
        self.client.disconnect()
        self.client.loop_stop()

    def drop(self):
        """Loses the connection without DISCONNECT."""
        self.client.loop_stop()
        self.client.socket().close()


def publish(conn, topic, payload, qos=1, retain=False, expiry=None):
    props = None
    if expiry is not None:
        props = Properties(PacketTypes.PUBLISH)
        props.MessageExpiryInterval = expiry
    info = conn.client.publish(topic, payload, qos=qos, retain=retain, properties=props)
    info.wait_for_publish(WAIT)
    return info


def check(name):
    def wrap(f):
        try:
            f()
            print(f"ok {name}")
        except Exception as e:  # noqa: BLE001 - the check reports whatever went wrong
            failures.append(name)
            print(f"FAIL {name}: {e}")
        return f

    return wrap


def expect(cond, why):
    if not cond:
        raise AssertionError(why)


@check("persistent session across reconnect")
def _():
    topic = f"t/{run}/session"
    sub = Conn("sess", clean_start=False, expiry=300)
    sub.subscribe(topic)
    sub.close()
    pub = Conn("sess-pub")
    publish(pub, topic, "while away")
    back = Conn("sess", clean_start=False, expiry=300)
    expect(back.session_present, "Session Present 0 on resume")
    got = back.wait_for(1)
    expect([m.payload.decode() for m in got] == ["while away"], f"got {[m.payload for m in got]}")
    back.close()
    pub.close()


@check("shared subscription")
def _():
    a, b = Conn("share-a"), Conn("share-b")
    for c in (a, b):
        c.subscribe(f"$share/g{run}/jobs/{run}/#")
    pub = Conn("share-pub")
    for i in range(10):
        publish(pub, f"jobs/{run}/x", str(i))
    time.sleep(0.3)
    na, nb = len(a.payloads()), len(b.payloads())
    expect(na + nb == 10 and na > 0 and nb > 0, f"{na} + {nb} of 10")
    for c in (a, b, pub):
        c.close()


@check("no local")
def _():
    topic = f"t/{run}/nolocal"
    me = Conn("nl")
    me.subscribe(topic, noLocal=True)
    publish(me, topic, "mine")
    other = Conn("nl-other")
    publish(other, topic, "theirs")
    got = me.wait_for(1)
    time.sleep(0.2)
    expect(me.payloads() == ["theirs"], f"got {me.payloads()}")
    me.close()
    other.close()


@check("retain handling")
def _():
    topic = f"t/{run}/retained"
    pub = Conn("rh-pub")
    publish(pub, topic, "kept", retain=True)
    never = Conn("rh-never")
    never.subscribe(topic, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
    once = Conn("rh-once")
    once.subscribe(topic, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
    once.subscribe(topic, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
    always = Conn("rh-always")
    always.subscribe(topic)
    always.subscribe(topic)
    time.sleep(0.3)
    expect(never.payloads() == [], f"retain handling 2 got {never.payloads()}")
    expect(once.payloads() == ["kept"], f"retain handling 1 got {once.payloads()}")
    expect(always.payloads() == ["kept", "kept"], f"retain handling 0 got {always.payloads()}")
    expect(all(m.retain for m in always.messages), "RETAIN not set on a retained message")
    publish(pub, topic, "", retain=True)
    for c in (pub, never, once, always):
        c.close()


@check("message expiry")
def _():
    topic = f"t/{run}/expiry"
    sub = Conn("exp", clean_start=False, expiry=300)
    sub.subscribe(topic)
    sub.close()
    pub = Conn("exp-pub")
    publish(pub, topic, "short", expiry=1)
    publish(pub, topic, "long", expiry=60)
    time.sleep(2.1)
    back = Conn("exp", clean_start=False, expiry=300)
    got = back.wait_for(1)
    time.sleep(0.2)
    expect(back.payloads() == ["long"], f"got {back.payloads()}")
    left = got[0].properties.MessageExpiryInterval
    expect(0 < left <= 58, f"remaining expiry {left}")
    back.close()
    pub.close()


@check("will with delay")
def _():
    topic = f"t/{run}/will"
    watcher = Conn("will-watch")
    watcher.subscribe(topic)
    dying = Conn("will-dying", expiry=60, will=(topic, "gone", 1))
    dying.drop()
    got = watcher.wait_for(1, timeout=WAIT + 2)
    expect([m.payload.decode() for m in got] == ["gone"], f"got {watcher.payloads()}")
    watcher.close()


@check("subscription bound")
def _():
    c = Conn("bound-subs")
    codes = [c.subscribe(f"b/{run}/{i}")[0] for i in range(5)]
    expect(codes[:4] == [1, 1, 1, 1] and codes[4] == 0x97, f"SUBACK codes {codes}")
    c.close()


@check("topic length bound")
def _():
    c = Conn("bound-topic")
    acked = threading.Event()
    result = {}

    def on_publish(client, userdata, mid, reason, props):
        result["reason"] = reason.value
        acked.set()

    c.client.on_publish = on_publish
    c.client.publish("x" * 100, "too long", qos=1)
    expect(acked.wait(WAIT), "no PUBACK")
    expect(result["reason"] == 0x90, f"PUBACK reason {result['reason']:#x}")
    c.close()


sys.exit(1 if failures else 0)
