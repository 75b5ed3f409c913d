#!/bin/bash
# device run 2 (session 18; as session 17's run2.sh, output streamed): the BENCH protocol run of main -- pip install ., then the speed suite with
# FlashKDA (.anchors/) and fla (.whl/) timed in the same run; then the decode rows from main's C++
# benchmark built on the development machine; last the host overhead of one call. Argument: the commit
# built. (The checkpoint cost and the segment-length sweep: run3.sh.)
set -u
exec > >(tee $OUT/log_bench.txt) 2>&1   # (what ran comes back even if the call is cut short)
S=$SECONDS
O=/tmp/o; mkdir -p $O
ROOT=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $O/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
(cd build-dev && tar -xJf n_bench.tar.xz)
echo "== pip install . [$((SECONDS-S))s]"
FLASH_KDA_COMMIT=$1 python3 -m pip install -q --no-build-isolation --no-deps . > $O/pip.log 2>&1 || { tail -30 $O/pip.log; exit 1; }
echo "== speed [$((SECONDS-S))s]"
cd /tmp   # (import the installed package, not the source folder)
export PYTHONPATH=/tmp/site:$ROOT/.anchors
timeout $((${RUN2_SPEED_LIMIT:-450} - (SECONDS-S))) python3 -m flash_kda.bench speed --cases gpu --fla ${RUN2_FLA:-h8_8k h4_64k fixed16} --flashkda auto --reps 20 --json $O/bench_py.json > $O/bench_py.log 2>&1
echo "speed rc=$?"
grep -E " ms " $O/bench_py.log | tail -16; grep -E "^- speed" $O/bench_py.log
cd $ROOT
B=build-dev/N/kda_bench
[[ -n "${RUN2_SPEED_ONLY:-}" ]] && { tar czf $OUT/all.tgz -C $O .; exit 0; }
echo "== decode [$((SECONDS-S))s]"
[[ $((SECONDS-S)) -lt 545 ]] && $B decode --reps 30 --json $O/decode.json > $O/decode.txt 2>&1; head -24 $O/decode.txt
echo "== host overhead [$((SECONDS-S))s]"
[[ $((SECONDS-S)) -lt 550 ]] && (cd /tmp && timeout $((585 - (SECONDS-S))) python3 $ROOT/bench/host_overhead.py --device cuda --repeats 5 --calls 1000 --json $O/host_overhead.json > $O/host_overhead.txt 2>&1); tail -12 $O/host_overhead.txt
echo "== done [$((SECONDS-S))s]"
tar czf $OUT/all.tgz -C $O .
