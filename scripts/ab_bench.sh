#!/usr/bin/env bash
# A/B timing of two or more builds of the C++ benchmark in the same run (docs/perf_log.md's
# protocol: the builds alternate, round after round, so that clock and thermal drift hit all alike).
#   bash scripts/ab_bench.sh A/kda_bench B/kda_bench [C/kda_bench ...] [ROUNDS] -- prefill --reps 10 fixed32 ...
# Everything after `--` is passed to every binary (`kda_bench prefill|decode ...`, e.g. --graph or
# --ckpt 1024; their --json is added here). Each round runs the builds in order; the table at the
# end gives, per (case, plan), the median over rounds of each build's median, and for every build
# after the first its ratio to the first (below 1: faster) with the per-round ratios. Raw JSON of
# every run lands in OUT (default /tmp/flash_kda_ab).
set -euo pipefail
usage() { sed -n '2,9p' "$0" >&2; exit 2; }
BINS=()
ROUNDS=2
while [[ $# -gt 0 && $1 != -- ]]; do
  if [[ $1 =~ ^[0-9]+$ ]]; then ROUNDS=$1; else BINS+=("$1"); fi
  shift
done
[[ ${1:-} == -- && ${#BINS[@]} -ge 2 ]] || usage
shift
OUTDIR=${OUT:-/tmp/flash_kda_ab}
mkdir -p "$OUTDIR"
for ((r = 1; r <= ROUNDS; ++r)); do
  for ((i = 0; i < ${#BINS[@]}; ++i)); do
    echo "== round $r, build $i: ${BINS[$i]} $*"
    "${BINS[$i]}" "$@" --json "$OUTDIR/b${i}_round$r.json"
  done
done
python3 - "$OUTDIR" "$ROUNDS" "${#BINS[@]}" <<'PY'
import json, statistics, sys
out, rounds, nb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(b, r):
    return {(x["case"], x["plan"]): x["ours_ms_median"] for x in json.load(open(f"{out}/b{b}_round{r}.json"))}
runs = [[load(b, r) for r in range(1, rounds + 1)] for b in range(nb)]
keys = [k for k in runs[0][0] if all(k in x for rb in runs for x in rb)]
head = f"{'case':<18} {'plan':<10} {'build 0 ms':>10}" + "".join(f" {f'{b}/0':>7}" for b in range(1, nb))
print(head + "  per round (each build / build 0)")
for k in keys:
    base = statistics.median(x[k] for x in runs[0])
    line = f"{k[0]:<18} {k[1]:<10} {base:10.4f}"
    per = []
    for b in range(1, nb):
        line += f" {statistics.median(x[k] for x in runs[b]) / base:7.3f}"
        per.append(" ".join(f"{rb[k] / ra[k]:.3f}" for ra, rb in zip(runs[0], runs[b])))
    print(line + "  " + " | ".join(per))
PY
