"""Summarises `edge-node spool stats` JSON (stdin) for the demo."""
import json
import sys

stats = json.load(sys.stdin)
for c in stats["classes"]:
    print(f"   spool: class {c['class']}: {c['messages']} messages, {c['bytes']} bytes waiting for the cloud")
size = stats["database_bytes"] + stats["wal_bytes"]
print(f"   spool: epoch {stats['epoch'][:8]}..., {size} bytes on disk")
