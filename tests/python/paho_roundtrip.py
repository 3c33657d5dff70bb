"""Round trip through the edge broker with paho-mqtt: QoS1 publish, a retained message, a
wildcard subscription. Usage: paho_roundtrip.py HOST PORT 3|5. Exits 0 and prints "ok" on
success, prints the problem and exits 1 otherwise."""
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

host, port, version = sys.argv[1], int(sys.argv[2]), sys.argv[3]
protocol = mqtt.MQTTv5 if version == "5" else mqtt.MQTTv311
prefix = f"paho{version}"

got = []
done = threading.Event()


def on_message(client, userdata, msg):
    props = {}
    if version == "5" and msg.properties is not None and hasattr(msg.properties, "UserProperty"):
        props = dict(msg.properties.UserProperty)
    got.append((msg.topic, msg.payload.decode(), msg.qos, msg.retain, props))
    if len(got) >= 2:
        done.set()


def client(name):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{prefix}-{name}", protocol=protocol)
    c.connect(host, port, keepalive=10)
    return c


# A retained message before anyone subscribes.
pub = client("pub")
pub.loop_start()
pub.publish(f"{prefix}/retained", "kept", qos=1, retain=True).wait_for_publish(5)

sub = client("sub")
sub.on_message = on_message
sub.loop_start()
subscribed = threading.Event()
sub.on_subscribe = lambda *a: subscribed.set()
sub.subscribe(f"{prefix}/#", qos=1)
if not subscribed.wait(5):
    print("no SUBACK")
    sys.exit(1)

props = None
if version == "5":
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = ("trace-id", "abc-123")
pub.publish(f"{prefix}/live/a", "hello", qos=1, properties=props).wait_for_publish(5)

if not done.wait(5):
    print(f"received only {got}")
    sys.exit(1)
retained = [g for g in got if g[0] == f"{prefix}/retained"]
live = [g for g in got if g[0] == f"{prefix}/live/a"]
if not retained or retained[0][1] != "kept" or not retained[0][3]:
    print(f"retained message missing or not flagged retained: {got}")
    sys.exit(1)
if not live or live[0][1] != "hello" or live[0][2] != 1:
    print(f"live QoS1 message wrong: {got}")
    sys.exit(1)
if version == "5" and live[0][4].get("trace-id") != "abc-123":
    print(f"user property lost: {live}")
    sys.exit(1)
# Clear the retained message so reruns start clean.
pub.publish(f"{prefix}/retained", "", qos=1, retain=True).wait_for_publish(5)
pub.loop_stop()
sub.loop_stop()
print("ok")
