"""Summary of model-sync-bench's JSON lines (scripts/bench-model-sync.sh)."""
import json
import sys


def transfer(t):
    if not t:
        return "not run"
    state = "staged" if t["staged"] else "NOT staged"
    return (
        f"{state} in {t['publish_to_staged_s']:.2f} s, fetched {t['fetched_bytes'] / 1e6:.1f} MB "
        f"of {t['size_bytes'] / 1e6:.1f} MB ({t['fetched_bytes'] / t['size_bytes']:.3f}), "
        f"{t['fetched_mb_per_s']:.1f} MB/s"
    )


for line in sys.stdin:
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    s = r["one_stream"]
    cut = "" if s["finished"] else " (cut at the timeout)"
    print(f"{r['mib']} MiB, {r['link']}, {r['cc']}:")
    print(f"  full : {transfer(r['full'])}")
    print(f"  delta: {transfer(r['delta'])}")
    print(
        f"  one quinn stream: {s['bytes'] / 1e6:.1f} MB in {s['seconds']:.2f} s = {s['mb_per_s']:.1f} MB/s{cut}; "
        f"full sync / one stream = {r['full_vs_one_stream']:.2f}"
    )
    sys.stdout.flush()
