"""Prints what the demo's cloud sink (SQLite) holds."""
import json
import sqlite3
import sys

db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT edge_id, lane, seq, topic, payload, headers FROM records ORDER BY edge_id, lane, seq").fetchall()
print(f"   cloud sink: {len(rows)} records")
for edge, lane, seq, topic, payload, headers in rows:
    h = dict(json.loads(headers or "[]"))
    schema = f" schema={h['Edge-Schema']} ({h.get('Edge-Schema-Id', '')})" if "Edge-Schema" in h else ""
    print(f"   cloud sink: {edge} lane {lane} seq {seq}: {topic} {payload.decode(errors='replace')} "
          f"trace-id={h.get('trace-id', '')}{schema}")
