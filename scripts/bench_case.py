"""One case of scripts/bench-local.sh as a JSON line: the generator's line with the broker's CPU
time over the case (user and system apart) and perf's counts of its context switches and
system calls (None where perf could not count them, e.g. without access to tracepoints).

Usage: bench_case.py LINE GENERATOR USER_TICKS SYSTEM_TICKS CLK_TCK PERF_CSV"""
import json
import sys

line, generator, user, system, tck, perf = sys.argv[1:7]
d = json.loads(open(line).read())
d["generator"] = generator
d["broker_user_s"] = int(user) / int(tck)
d["broker_sys_s"] = int(system) / int(tck)
d["broker_cpu_s"] = d["broker_user_s"] + d["broker_sys_s"]
counts = {}
try:
    for row in open(perf):
        fields = row.strip().split(",")
        # perf stat -x,: value, unit, event, ...; "<not counted>" or "<not supported>" if not.
        if len(fields) > 2 and fields[0].replace(".", "", 1).isdigit():
            counts[fields[2]] = float(fields[0])
except FileNotFoundError:
    pass
d["broker_switches"] = counts.get("context-switches")
d["broker_syscalls"] = counts.get("raw_syscalls:sys_enter")
print(json.dumps(d))
