"""paho-mqtt (MQTT 5) as a local app on an edge that is killed and restarted under it.

Usage:
  paho_downlink_sub.py HOST PORT CLIENT_ID

Keeps one persistent session (Session Expiry one hour, Clean Start 0, so the broker keeps what
comes while the edge or the app is away), subscribed to cmd/# at QoS 2 and config/# at QoS 1,
reconnecting whenever the node goes away. Prints "subscribed" once the SUBACK came, then a JSON
line [topic, payload, dup, mid] per message, flushed at once. paho answers a PUBREL the broker
resends after a reconnect (MQTT 5.0 4.4) and delivers a resent QoS 2 PUBLISH once.
"""
import json
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

host, port, client_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lock = threading.Lock()


def say(line):
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def on_message(client, userdata, msg):
    say(json.dumps([msg.topic, msg.payload.decode("utf-8", "replace"), bool(msg.dup), msg.mid]))


def on_connect(client, userdata, flags, reason, properties):
    if not flags.session_present:
        client.subscribe([("cmd/#", 2), ("config/#", 1)])


c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
c.reconnect_delay_set(min_delay=0.05, max_delay=0.5)
c.on_message = on_message
c.on_connect = on_connect
c.on_subscribe = lambda *a: say("subscribed")
p = Properties(PacketTypes.CONNECT)
p.SessionExpiryInterval = 3600
c.connect(host, port, keepalive=5, clean_start=False, properties=p)
c.loop_forever(retry_first_connection=True)
