"""Summarises `edge-node spool stats` JSON (stdin) for the demo."""
import json
import sys

stats = json.load(sys.stdin)
for c in stats["classes"]:
    print(f"   spool: class {c['class']}: {c['messages']} messages, {c['bytes']} bytes waiting for the cloud")
if not any(c["messages"] for c in stats["classes"]):
    print("   spool: nothing waiting: the cloud acked everything")
size = stats["database_bytes"] + stats["wal_bytes"]
print(f"   spool: epoch {stats['epoch'][:8]}..., {size} bytes on disk")
