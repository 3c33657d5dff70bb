"""The functions a callgrind dump spends its instructions in: self and inclusive counts, with
how often each was called. For dumps written with `--compress-strings=no` (as
scripts/bench-instructions.sh writes them; valgrind 3.19's callgrind_annotate lists only the
thread's `clone` for such a dump of a multi-threaded Rust program).

Usage: callgrind_top.py DUMP [N=40] [--callers FUNCTION]"""
import collections
import sys

args = sys.argv[1:]
callers_of = None
if "--callers" in args:
    i = args.index("--callers")
    callers_of = args[i + 1]
    del args[i : i + 2]
path, top = args[0], int(args[1]) if len(args) > 1 else 40

own = collections.Counter()
called = collections.Counter()
calls = collections.Counter()
edges = collections.Counter()
fn = cfn = None
after_calls = False
count = 0
for line in open(path):
    line = line.rstrip("\n")
    if line.startswith("fn="):
        fn = line[3:]
    elif line.startswith("cfn="):
        cfn = line[4:]
    elif line.startswith("calls="):
        after_calls, count = True, int(line[6:].split()[0])
    elif line[:1].isdigit() or line[:1] in "+-*":
        fields = line.split()
        if len(fields) < 2:
            continue
        cost = int(fields[1])
        if after_calls:
            # The line after `calls=` is the callee's inclusive cost at that call site.
            after_calls = False
            calls[cfn] += count
            edges[(fn, cfn)] += cost
            if cfn != fn:
                called[fn] += cost
        else:
            own[fn] += cost

total = sum(own.values())
if callers_of:
    rows = sorted(((c, f) for (f, g), c in edges.items() if g == callers_of), reverse=True)[:top]
    for cost, f in rows:
        print(f"{cost:>13,} {f[:160]}")
    sys.exit()
print(f"{total:,} instructions\n\nself:")
for f, c in own.most_common(top):
    print(f"{c:>13,} {100 * c / total:5.1f}% {f[:160]}")
print("\ninclusive:")
inclusive = {f: own[f] + called[f] for f in set(own) | set(called)}
for f, c in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
    print(f"{c:>13,} {100 * c / total:5.1f}% {calls[f]:>8} calls  {f[:140]}")
