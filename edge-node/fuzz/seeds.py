"""Writes the seed corpus of the `mqtt` fuzz target (corpus/mqtt): for each version, a CONNECT
followed by packets of every type a client sends (and some it must not), so the fuzzer starts
inside each decoder and each core handler. Usage: python3 seeds.py (from edge-node/fuzz)."""
import hashlib
import os


def varint(n):
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        if n:
            b |= 0x80
        out.append(b)
        if not n:
            return bytes(out)


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return len(b).to_bytes(2, "big") + b


def frame(first, body):
    return bytes([first]) + varint(len(body)) + body


def connect(v5, flags=0b0000_0010, extra=b""):
    body = s("MQTT") + bytes([5 if v5 else 4, flags]) + (30).to_bytes(2, "big")
    if v5:
        props = bytes([0x11]) + (60).to_bytes(4, "big") + bytes([0x21, 0, 8, 0x22, 0, 4])
        body += varint(len(props)) + props
    return frame(0x10, body + s("fuzz") + extra)


def props(v5, data):
    return (varint(len(data)) + data) if v5 else b""


def publish(v5, qos, pkid=1, topic="a/b", payload=b"x", retain=False, p=b""):
    body = s(topic) + (pkid.to_bytes(2, "big") if qos else b"") + props(v5, p) + payload
    return frame(0x30 | (qos << 1) | int(retain), body)


def seeds(v5):
    user = bytes([0x26]) + s("k") + s("v")
    yield "qos0", publish(v5, 0)
    yield "qos1", publish(v5, 1, p=user if v5 else b"")
    yield "qos2", publish(v5, 2) + frame(0x62, (1).to_bytes(2, "big"))
    yield "retained", publish(v5, 1, retain=True) + publish(v5, 0, topic="a/b", payload=b"", retain=True)
    yield "acks", frame(0x40, b"\x00\x01") + frame(0x50, b"\x00\x02") + frame(0x70, b"\x00\x02")
    yield "subscribe", frame(0x82, b"\x00\x05" + props(v5, bytes([0x0B, 7])) + s("a/#") + bytes([0b0010_1110 if v5 else 1]))
    yield "shared", frame(0x82, b"\x00\x06" + props(v5, b"") + s("$share/g/a/+") + bytes([1]))
    yield "unsubscribe", frame(0xA2, b"\x00\x07" + props(v5, b"") + s("a/#"))
    yield "ping", frame(0xC0, b"")
    yield "disconnect", frame(0xE0, bytes([0x04]) + props(v5, bytes([0x11, 0, 0, 0, 9])) if v5 else b"")
    yield "server_packets", frame(0x20, b"\x00\x00") + frame(0x90, b"\x00\x01\x00") + frame(0xB0, b"\x00\x01")
    yield "reserved", frame(0x00, b"") + frame(0xF0, b"\x00")
    yield "oversized_length", b"\x30\xff\xff\xff\x7f"
    yield "will", b""
    if v5:
        yield "alias", publish(v5, 0, p=bytes([0x23, 0, 3])) + publish(v5, 0, topic="", p=bytes([0x23, 0, 3]))
        yield "expiry", publish(v5, 1, p=bytes([0x02, 0, 0, 0, 1, 0x01, 1]) + bytes([0x03]) + s("text/plain"))
        yield "auth", frame(0xF0, bytes([0x18, 0]))


os.makedirs("corpus/mqtt", exist_ok=True)
for v5 in (False, True):
    for name, packets in seeds(v5):
        if name == "will":
            flags = 0b0010_1110 if v5 else 0b0000_1110
            will = (props(v5, bytes([0x18, 0, 0, 0, 1])) + s("last/will") + s("gone"))
            data = bytes([1 if v5 else 0]) + connect(v5, flags, will)
        else:
            data = bytes([1 if v5 else 0]) + connect(v5) + packets
        digest = hashlib.sha1(data).hexdigest()
        with open(f"corpus/mqtt/{digest}", "wb") as f:
            f.write(data)
