"""Prints what the demo's cloud sink (SQLite) holds."""
import json
import sqlite3
import sys

db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT edge_id, lane, seq, topic, payload, headers FROM records ORDER BY edge_id, lane, seq").fetchall()
print(f"   cloud sink: {len(rows)} records")
for edge, lane, seq, topic, payload, headers in rows:
    trace = dict(json.loads(headers or "[]")).get("trace-id", "")
    print(f"   cloud sink: {edge} lane {lane} seq {seq}: {topic} {payload.decode(errors='replace')} trace-id={trace}")
