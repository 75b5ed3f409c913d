#!/bin/bash
# device run 3 (session 18): where the checkpoint cost comes from (issue 14), with main's kda_bench
# (build-dev/M/kda_bench, shipped to the GPU machine as build-dev/m.tar.xz): none / --ckpt 1024 / --ckpt 131072 (the
# checkpoint kernels with no boundary reached: their code alone), three rounds alternating; ncu of
# every kernel of one fixed32 and one fixed16 call, with and without checkpoints. Then, on an H200
# only, the BENCH-protocol run (as run2.sh) of the commit given as $1.
set -u
exec > >(tee $OUT/log.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
t() { echo "[$((SECONDS-S))s]"; }
(cd build-dev && tar -xJf m.tar.xz)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
B=build-dev/M/kda_bench
CK="fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k"
echo "== checkpoint cost $(t)"
for r in 1 2 3; do
  $B prefill --reps 10 --json $O/ck0_$r.json $CK > /dev/null 2>&1
  $B prefill --reps 10 --ckpt 1024 --json $O/ck1024_$r.json $CK > /dev/null 2>&1
  $B prefill --reps 10 --ckpt 131072 --json $O/cknone_$r.json $CK > /dev/null 2>&1
done
python3 - <<'PY'
import json, statistics, glob
def load(tag): return [{x['case']: x['ours_ms_median'] for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{tag}_*.json'))]
a, b, c = load('ck0'), load('ck1024'), load('cknone')
print(f"{'case':<12} {'none ms':>8} {'ck1024':>7} {'ck-no-boundary':>15}")
for k in a[0]:
    m = lambda r: statistics.median(x[k] for x in r)
    print(f"{k:<12} {m(a):8.4f} {m(b)/m(a):7.3f} {m(c)/m(a):15.3f}")
PY
echo "== ncu $(t)"
for c in ${NCU_CASES:-fixed32 fixed16}; do
  for ck in ${NCU_CKPT:-0 1024}; do
    A=""; [[ $ck -gt 0 ]] && A="--ckpt $ck"
    timeout 60 ncu --launch-count 12 --section SpeedOfLight $B prefill --reps 1 $A $c > $O/ncu_${c}_$ck.txt 2>&1
    echo "-- $c ckpt $ck: $(grep -E '^  [a-z].*kda_|Duration' $O/ncu_${c}_$ck.txt | sed -E 's/\(cuda::KdaFwdArgs.*//; s/.*void cuda::| Duration us//; s/^ +//; s/ +/ /g' | grep -v fill_normal | paste -sd' ' )"
  done
done
tar czf $OUT/ck.tgz -C $O .
if [[ "$GPU" == *H200* && -n "${1:-}" ]]; then
  echo "== BENCH protocol on the H200 $(t)"
  RUN2_SPEED_LIMIT=$((560 - (SECONDS-S))) RUN2_FLA="h8_8k h4_64k" RUN2_SPEED_ONLY=1 bash bench/results/s18/run2.sh "$1"
fi
echo "== done $(t)"
