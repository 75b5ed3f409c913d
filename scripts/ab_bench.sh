#!/usr/bin/env bash
# A/B timing of two builds of the C++ benchmark in the same run (docs/perf_log.md's protocol: the
# builds alternate, round after round, so that clock and thermal drift hit both alike).
#   bash scripts/ab_bench.sh A/kda_bench B/kda_bench [ROUNDS] -- prefill --reps 10 fixed32 h8_8k ...
# Everything after `--` is passed to both binaries (`kda_bench prefill|decode ...`, their --json is
# added here). Each round runs A, then B; the table at the end gives, per (case, plan), the median
# over rounds of each build's median and the ratio B / A (below 1: B is faster), with the spread of
# the per-round ratios. Raw JSON of every run lands in OUT (default /tmp/flash_kda_ab).
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
A=$1 B=$2
shift 2
ROUNDS=2
if [[ $1 != -- ]]; then
  ROUNDS=$1
  shift
fi
[[ ${1:-} == -- ]] || { echo "ab_bench.sh: expected -- before the benchmark's arguments" >&2; exit 2; }
shift
OUTDIR=${OUT:-/tmp/flash_kda_ab}
mkdir -p "$OUTDIR"
for ((r = 1; r <= ROUNDS; ++r)); do
  for side in A B; do
    bin=$A
    [[ $side == B ]] && bin=$B
    echo "== round $r, $side: $bin $*"
    "$bin" "$@" --json "$OUTDIR/${side}_round$r.json"
  done
done
python3 - "$OUTDIR" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(side, r):
    return {(x["case"], x["plan"]): x["ours_ms_median"] for x in json.load(open(f"{out}/{side}_round{r}.json"))}
runs = {s: [load(s, r) for r in range(1, rounds + 1)] for s in "AB"}
keys = [k for k in runs["A"][0] if all(k in x for s in "AB" for x in runs[s])]
print(f"{'case':<18} {'plan':<10} {'A ms':>9} {'B ms':>9} {'B/A':>7}  per round")
for k in keys:
    a = statistics.median(x[k] for x in runs["A"])
    b = statistics.median(x[k] for x in runs["B"])
    per = [rb[k] / ra[k] for ra, rb in zip(runs["A"], runs["B"])]
    print(f"{k[0]:<18} {k[1]:<10} {a:9.4f} {b:9.4f} {b / a:7.3f}  " + " ".join(f"{p:.3f}" for p in per))
PY
