#!/bin/bash
# device run 2 (session 17): the BENCH protocol run of main -- pip install ., then the speed suite with
# FlashKDA (.anchors/) and fla (.whl/) timed in the same run; then the host overhead of one call
set -u
S=$SECONDS
O=/tmp/o; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
# checkpoint cost (issue 14 item 2) and the decode rows, from main's C++ benchmark built on the development machine
(cd build-dev && tar -xJf n_bench.tar.xz)
CK="fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k long64k_32"
echo "== checkpoint cost [$((SECONDS-S))s]"
for r in 1 2 3; do
  build-dev/N/kda_bench prefill --reps 10 --json $O/ck0_$r.json $CK > $O/ck0_$r.txt 2>&1
  build-dev/N/kda_bench prefill --reps 10 --ckpt 1024 --json $O/ck1024_$r.json $CK > $O/ck1024_$r.txt 2>&1
done
python3 - <<'PY'
import json,statistics
def med(tag):
    runs=[{x['case']:x['ours_ms_median'] for x in json.load(open(f'/tmp/o/{tag}_{r}.json'))} for r in (1,2,3)]
    return {k:statistics.median(x[k] for x in runs) for k in runs[0]}, runs
a,ra=med('ck0'); b,rb=med('ck1024')
for k in a: print(f"{k:<12} none {a[k]:.4f}  ckpt1024 {b[k]:.4f}  ratio {b[k]/a[k]:.3f}  rounds "+" ".join(f"{y[k]/x[k]:.3f}" for x,y in zip(ra,rb)))
PY
echo "== decode [$((SECONDS-S))s]"
build-dev/N/kda_bench decode --reps 30 --json $O/decode.json > $O/decode.txt 2>&1; head -30 $O/decode.txt
echo "== pip install . [$((SECONDS-S))s]"
FLASH_KDA_COMMIT=$1 python3 -m pip install -q --no-build-isolation --no-deps . > $O/pip.log 2>&1 || { tail -30 $O/pip.log; exit 1; }
echo "== speed [$((SECONDS-S))s]"
cd /tmp   # (import the installed package, not the source folder)
export PYTHONPATH=/tmp/site:$OLDPWD/.anchors
timeout $((540 - (SECONDS-S))) python3 -m flash_kda.bench speed --cases gpu --fla h8_8k h4_64k fixed16 --flashkda auto --reps 20 --json $O/bench_py.json > $O/bench_py.log 2>&1
echo "speed rc=$?"
grep -E "ms|speed:" $O/bench_py.log | grep -v "^flash_kda.bench:" | tail -20
echo "== host overhead [$((SECONDS-S))s]"
[[ $((SECONDS-S)) -lt 520 ]] && timeout $((580 - (SECONDS-S))) python3 $OLDPWD/bench/host_overhead.py --device cuda --repeats 7 --json $O/host_overhead.json > $O/host_overhead.txt 2>&1; tail -14 $O/host_overhead.txt
echo "== done [$((SECONDS-S))s]"
tar czf $OUT/all.tgz -C $O .
