#!/bin/bash
# device run 2 (session 17): the BENCH protocol run of main -- pip install ., then the speed suite with
# FlashKDA (.anchors/) and fla (.whl/) timed in the same run; then the host overhead of one call
set -u
S=$SECONDS
O=/tmp/o; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
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
