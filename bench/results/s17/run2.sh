#!/bin/bash
# device run 2 (session 17): the BENCH protocol run of main -- pip install ., then the speed suite with
# FlashKDA (.anchors/) and fla (.whl/) timed in the same run; then, from main's C++ benchmark built on the
# development machine: the checkpoint cost (issue 14 item 2), a segment-length sweep of the two split rows
# short of issue 10's must, the decode rows; last the host overhead of one call. Argument: the commit built.
set -u
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
timeout $((450 - (SECONDS-S))) python3 -m flash_kda.bench speed --cases gpu --fla h8_8k h4_64k fixed16 --flashkda auto --reps 20 --json $O/bench_py.json > $O/bench_py.log 2>&1
echo "speed rc=$?"
grep -E " ms " $O/bench_py.log | tail -16; grep -E "^- speed" $O/bench_py.log
cd $ROOT
B=build-dev/N/kda_bench
CK="fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k"
echo "== checkpoint cost [$((SECONDS-S))s]"
for r in 1 2; do
  [[ $((SECONDS-S)) -gt 500 ]] && break
  $B prefill --reps 10 --json $O/ck0_$r.json $CK > $O/ck0_$r.txt 2>&1
  $B prefill --reps 10 --ckpt 1024 --json $O/ck1024_$r.json $CK > $O/ck1024_$r.txt 2>&1
done
python3 - <<'PY'
import json,statistics,glob
def load(tag): return [{x['case']:x['ours_ms_median'] for x in json.load(open(f))} for f in sorted(glob.glob(f'/tmp/o/{tag}_*.json'))]
ra,rb=load('ck0'),load('ck1024')
for k in (ra[0] if ra else {}):
    if len(rb)<len(ra): break
    a=statistics.median(x[k] for x in ra); b=statistics.median(x[k] for x in rb)
    print(f"{k:<12} none {a:.4f}  ckpt1024 {b:.4f}  ratio {b/a:.3f}  rounds "+" ".join(f"{y[k]/x[k]:.3f}" for x,y in zip(ra,rb)))
PY
echo "== segment length sweep [$((SECONDS-S))s]"
[[ $((SECONDS-S)) -lt 520 ]] && $B prefill --reps 10 --plans auto,split32:144,split32:168,split32:200,split32:232,split32:256 fixed32 > $O/sweep_fixed32.txt 2>&1
[[ $((SECONDS-S)) -lt 530 ]] && $B prefill --reps 5 --plans auto,split32:1200,split32:1360,split32:1600,split32:1800,split32:2048 long64k_32 > $O/sweep_long.txt 2>&1
grep -hE "^(fixed32|long64k_32) " $O/sweep_*.txt
echo "== decode [$((SECONDS-S))s]"
[[ $((SECONDS-S)) -lt 545 ]] && $B decode --reps 30 --json $O/decode.json > $O/decode.txt 2>&1; head -24 $O/decode.txt
echo "== host overhead [$((SECONDS-S))s]"
[[ $((SECONDS-S)) -lt 550 ]] && (cd /tmp && timeout $((585 - (SECONDS-S))) python3 $ROOT/bench/host_overhead.py --device cuda --repeats 5 --calls 1000 --json $O/host_overhead.json > $O/host_overhead.txt 2>&1); tail -12 $O/host_overhead.txt
echo "== done [$((SECONDS-S))s]"
tar czf $OUT/all.tgz -C $O .
