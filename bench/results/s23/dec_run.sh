#!/bin/bash
# device run (sessions 23 and 24, branch decode-bf16): the streaming decode kernel for bf16 and fp32
# pools (m = the branch: persistent CTAs with the next unit's state and inputs in flight, the decay
# deferred over T >= 2 tokens; docs/perf_log.md, sessions 23 and 24: the fp32 rows decode256_32,
# b64/b256_t1/t4_fp32 stream since session 24) against main at b7e5201 (h). Shipped as
# build-dev/dec.tar.xz: dec/m/{kda_bench,test_cuda_decode,test_cuda_sanitize}, dec/h/kda_bench.
# Three alternating rounds of `kda_bench decode --reps 30`, the median ratio m/h of every case (and
# each side's floor ratio), then m's GPU decode tests and compute-sanitizer memcheck / racecheck of
# its decode sanitizer case. Outputs under $OUT. Usage, in the repository root:
#   bash bench/results/s23/dec_run.sh
set -u
: "${OUT:=/tmp/dec_out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
O=$OUT/ab
mkdir -p "$O"
(cd build-dev && tar -xJf dec.tar.xz)
B=build-dev/dec
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
# the builds shipped: h, m and (since session 24) m0 = m without the transposing row sums
BUILDS=$(for b in h m0 m; do [ -x $B/$b/kda_bench ] && echo $b; done)
for r in 1 2 3; do
  for b in $BUILDS; do
    $B/$b/kda_bench decode --reps 30 --json "$O/dec_${b}_$r.json" > "$O/dec_${b}_$r.txt" 2>&1
    echo "round $r $b rc=$? $(t)"
  done
done
python3 - "$O" $BUILDS <<'PY'
import json, statistics, glob, sys
d, builds = sys.argv[1], sys.argv[2:]
def load(b): return [{x['case']: x for x in json.load(open(f))} for f in sorted(glob.glob(f'{d}/dec_{b}_*.json'))]
runs = {b: load(b) for b in builds}
h = runs.get('h')
if not h or len(runs) < 2:
    print("no results"); sys.exit(0)
others = [b for b in builds if b != 'h']
print(f"{'case':<22} {'h ms':>8} {'h flr':>6}" + "".join(f" {b+' ms':>8} {b+'/h':>6} {b+' flr':>6}" for b in others) + "  per round")
for c in h[0]:
    th = [x[c]['ours_ms_median'] for x in h if c in x]
    if not th: continue
    fl = statistics.median([x[c]['copy_ms_median'] for b in builds for x in runs[b] if c in x])
    mh = statistics.median(th)
    line, per = f"{c:<22} {mh:8.4f} {mh/fl:6.2f}", []
    for b in others:
        tb = [x[c]['ours_ms_median'] for x in runs[b] if c in x]
        if not tb: line += " " * 23; continue
        mb = statistics.median(tb)
        line += f" {mb:8.4f} {mb/mh:6.3f} {mb/fl:6.2f}"
        per.append(b + " " + " ".join(f"{y/x:.3f}" for x, y in zip(th, tb)))
    print(line + "  " + "; ".join(per))
PY
echo "== tests $(t)"
timeout 120 $B/m/test_cuda_decode > "$OUT/test_cuda_decode.log" 2>&1
rc=$?
echo "test_cuda_decode rc=$rc $(grep -cE '^\[       OK \]' "$OUT/test_cuda_decode.log") ok, $(grep -cE '^\[  FAILED  \]' "$OUT/test_cuda_decode.log") failed-lines; $(grep -c 'streaming' "$OUT/test_cuda_decode.log") streaming-case lines"
grep -E 'streaming' "$OUT/test_cuda_decode.log" | head -6
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool $B/m/test_cuda_sanitize --gtest_filter='*Decode*' > "$OUT/san_$tool.log" 2>&1
  rc=$?
  echo "$tool rc=$rc tests: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/san_$tool.log" | tr '\n' ' ') $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.log" | tail -1)"
done
echo "== done $(t)"
