#!/bin/bash
# device run 4 (session 18): the two-pass bf16 decode restricted to one token a step (D1 = main +
# 92cc729 with decode_row_passes taking two passes only for a fixed batch of T = 1) against main (M),
# shipped to the GPU machine as build-dev/d1.tar.xz: decode A/B alternating (three rounds), D1's GPU decode tests,
# memcheck and racecheck of D1's decode; then, on an H200 only, the BENCH-protocol run of commit $1
# (run2.sh; ship .whl, .anchors, build-dev/n_bench.tar.xz too).
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf d1.tar.xz)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for r in 1 2 3; do
  for b in M D1; do
    build-dev/$b/kda_bench decode --reps 30 --json $O/dec_${b}_$r.json > $O/dec_${b}_$r.txt 2>&1
  done
done
python3 - <<'PY'
import json, statistics, glob
def load(b): return [{x['case']: x for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/dec_{b}_*.json'))]
a, b = load('M'), load('D1')
print(f"{'case':<22} {'M ms':>8} {'D1 ms':>8} {'D1/M':>6} {'M flr':>6} {'D1 flr':>6}  per round")
for c in a[0]:
    ta = [x[c]['ours_ms_median'] for x in a]; tb = [x[c]['ours_ms_median'] for x in b]
    fl = statistics.median(x[c]['copy_ms_median'] for x in a)
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"{c:<22} {ma:8.4f} {mb:8.4f} {mb/ma:6.3f} {ma/fl:6.2f} {mb/fl:6.2f}  " + " ".join(f"{y/x:.3f}" for x, y in zip(ta, tb)))
PY
echo "== tests $(t)"
timeout 60 build-dev/D1/test_cuda_decode > $O/test_cuda_decode.log 2>&1
echo "test_cuda_decode rc=$? $(grep -c ' ok' $O/test_cuda_decode.log) ok-lines $(grep -ciE 'fail' $O/test_cuda_decode.log) fail-lines"
grep -E 'two passes|one pass' $O/test_cuda_decode.log | head -8
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool build-dev/D1/test_cuda_sanitize --gtest_filter='*Decode*' > $O/san_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/san_$tool.log | tail -1)"
done
tar czf $OUT/d1.tgz -C $O .
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [[ -n "${1:-}" ]]; then
  echo "== BENCH protocol on the H200 $(t)"
  RUN2_SPEED_LIMIT=$((570 - (SECONDS-S))) RUN2_FLA="h8_8k h4_64k" RUN2_SPEED_ONLY=1 bash bench/results/s18/run2.sh "$1"
fi
echo "== done $(t)"
