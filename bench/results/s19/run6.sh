#!/bin/bash
# device run 6 (session 19): the Python benchmark's speed suite of commit $1 on whatever card came
# (an H100 this session: not the BENCH protocol's H200) -- pip install ., then the serving and gpu
# cases with FlashKDA (.anchors/) and fla (.whl/, on the cases in $RUN_FLA) timed in the same run.
set -u
exec > >(tee $OUT/log_bench.txt) 2>&1
S=$SECONDS
O=/tmp/o; mkdir -p $O
ROOT=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
echo "== pip install . [$((SECONDS-S))s]"
FLASH_KDA_COMMIT=$1 CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps . > $O/pip.log 2>&1 || { tail -30 $O/pip.log; exit 1; }
echo "== speed [$((SECONDS-S))s]"
cd /tmp   # (import the installed package, not the source folder)
export PYTHONPATH=/tmp/site:$ROOT/.anchors
timeout $((${RUN6_LIMIT:-570} - (SECONDS-S))) python3 -m flash_kda.bench speed --cases gpu --fla ${RUN_FLA:-h8_8k h4_64k} --flashkda auto --reps 20 --json $O/bench_py.json > $O/bench_py.log 2>&1
echo "speed rc=$?"
grep -E " ms " $O/bench_py.log | tail -20; grep -E "^- speed" $O/bench_py.log
echo "== done [$((SECONDS-S))s]"
tar czf $OUT/all.tgz -C $O .
