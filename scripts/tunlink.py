#!/usr/bin/env python3
"""An impaired IP link between two network namespaces, for TCP and UDP alike (this kernel has
no netem, and the UDP relay in the test support cannot carry TCP).

Creates namespaces A and B (if missing), a TUN device in each (10.99.0.1 in A, 10.99.0.2 in
B, each the other's only route), and forwards IP packets between the two devices in user
space with a one-way delay, uniform jitter and random loss, both ways. Runs until SIGTERM or
SIGINT, then deletes the namespaces it made.

    tunlink.py --a NS_A --b NS_B [--delay-ms 25] [--jitter-ms 0] [--loss 0.01] [--ready FILE]

Processes run in a namespace with `ip netns exec NS ...` and reach the other side at its
10.99.0.x address. Root only.
"""

import argparse
import fcntl
import heapq
import os
import random
import selectors
import signal
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
ADDR = {"a": "10.99.0.1", "b": "10.99.0.2"}


def sh(*args):
    subprocess.run(args, check=True)


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--delay-ms", type=float, default=25.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--ready")
    args = p.parse_args()

    made = []
    try:
        link(args, made)
    finally:
        # Also when setting up failed half way: no namespace of ours is left behind.
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns])


def link(args, made):
    existing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    fds = {}
    for side, ns in (("a", args.a), ("b", args.b)):
        if ns not in existing.split():
            sh("ip", "netns", "add", ns)
            made.append(ns)
        dev = f"tl{side}{os.getpid() % 100000}"
        # The fd stays bound to the device after it moves into the namespace.
        fds[side] = open_tun(dev)
        sh("ip", "link", "set", dev, "netns", ns)
        ex = ["ip", "netns", "exec", ns]
        sh(*ex, "ip", "link", "set", "lo", "up")
        sh(*ex, "ip", "addr", "add", ADDR[side] + "/32", "dev", dev)
        sh(*ex, "ip", "link", "set", dev, "mtu", "1500", "up")
        other = ADDR["b" if side == "a" else "a"]
        sh(*ex, "ip", "route", "add", other + "/32", "dev", dev)

    stop = False

    def on_signal(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.ready:
        with open(args.ready, "w") as f:
            f.write("ready\n")

    sel = selectors.DefaultSelector()
    sel.register(fds["a"], selectors.EVENT_READ, ("a", "b"))
    sel.register(fds["b"], selectors.EVENT_READ, ("b", "a"))
    queue = []  # (due, n, to_side, packet)
    n = 0
    stats = {"forwarded": 0, "dropped": 0}
    delay, jitter = args.delay_ms / 1000.0, args.jitter_ms / 1000.0
    while not stop:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, to, pkt = heapq.heappop(queue)
            try:
                os.write(fds[to], pkt)
                stats["forwarded"] += 1
            except OSError:
                stats["dropped"] += 1
        timeout = max(0.0, queue[0][0] - now) if queue else 0.5
        try:
            events = sel.select(timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for key, _ in events:
            src, dst = key.data
            for _ in range(256):
                try:
                    pkt = os.read(fds[src], 65535)
                except BlockingIOError:
                    break
                if random.random() < args.loss:
                    stats["dropped"] += 1
                    continue
                d = delay + (random.uniform(-jitter, jitter) if jitter else 0.0)
                n += 1
                heapq.heappush(queue, (now + max(0.0, d), n, dst, pkt))
    print(f"tunlink: {stats['forwarded']} packets forwarded, {stats['dropped']} dropped", file=sys.stderr)


if __name__ == "__main__":
    main()
