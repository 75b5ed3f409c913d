"""The decode A/B table of a session-27 run: python3 dec_table.py DIR BUILD... (DIR/<build>_<round>.json
from `kda_bench decode --json`, rounds 1 and 2; the first build is the baseline). Per case: the
baseline's median ms and floor ratio, then each other build's time ratio to it and its floor ratio."""
import json
import statistics
import sys

d, builds = sys.argv[1], sys.argv[2:]
L = {b: [{x['case']: x for x in json.load(open(f'{d}/{b}_{r}.json'))} for r in (1, 2)] for b in builds}
h = L[builds[0]]
print(f"{'case':<22} {'h ms':>8} {'h flr':>6}" + "".join(f" {b + '/h':>7} {'flr':>5}" for b in builds[1:]))
for c in h[0]:
    fl = statistics.median([x[c]['copy_ms_median'] for b in builds for x in L[b] if c in x])
    th = statistics.median(x[c]['ours_ms_median'] for x in h)
    line = f"{c:<22} {th:8.4f} {th / fl:6.3f}"
    for b in builds[1:]:
        tb = statistics.median(x[c]['ours_ms_median'] for x in L[b] if c in x)
        line += f" {tb / th:7.3f} {tb / fl:5.3f}"
    print(line)
