"""paho-mqtt publishing over MQTT 5 (or 3.1.1) and reporting each acknowledgement.

Usage: paho_publish_v5.py HOST PORT QOS [--v311] < messages

Reads one JSON line per message, [topic, payload], publishes each at QOS in order and waits for
its PUBACK (QoS 1) or the end of its exchange (QoS 2, refused at the PUBREC or completed by
the PUBCOMP), then prints one JSON line per message: [reason code, Reason String or null].
paho reports the reason code of a refused publish's PUBACK or PUBREC as the on_publish
reason_code and the Reason String in its properties (MQTT 5.0 3.4.2.2.2).
"""
import json
import sys
import threading

import paho.mqtt.client as mqtt

host, port, qos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
v311 = "--v311" in sys.argv[4:]
acks = {}
done = threading.Condition()


def on_publish(client, userdata, mid, reason_code, properties):
    reason = getattr(properties, "ReasonString", None) if properties is not None else None
    code = reason_code.value if hasattr(reason_code, "value") else int(reason_code)
    with done:
        acks[mid] = [code, reason]
        done.notify_all()


protocol = mqtt.MQTTv311 if v311 else mqtt.MQTTv5
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="", protocol=protocol)
c.on_publish = on_publish
c.connect(host, port)
c.loop_start()
for line in sys.stdin:
    if not line.strip():
        continue
    topic, payload = json.loads(line)
    info = c.publish(topic, payload.encode(), qos=qos)
    with done:
        if not done.wait_for(lambda: info.mid in acks, timeout=10):
            print(json.dumps(["timeout", None]), flush=True)
            continue
        print(json.dumps(acks[info.mid]), flush=True)
c.disconnect()
c.loop_stop()
