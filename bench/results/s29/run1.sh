#!/bin/bash
# Session 29, call 1: main (m = 08e6317) and two decode variants: d1 (e14e42c: the walk's token
# count from each thread's own reading; thread 0's reading only decides liveness, slot and out's
# rows) and d2 (d1 with the decays folded into the token vectors for steps of several tokens).
#   1. the decode table, m, d1 and d2 alternating, two rounds; d2's decode GPU tests,
#      memcheck, racecheck;
#   2. m's forward GPU tests (every plan), its prefill table from CUDA graphs (both BENCH tables),
#      the filled rows under the automatic, fused and prepared plans;
#   3. the checkpoint cost: --ckpt 1024 against none, alternating, two rounds (issue 14);
#   4. the Python suite (pip install .) with FlashKDA (.anchors/) timed in the same run (fla on the
#      cases in RUN_FLA, default none: run6.sh).
#   OUT=<dir> [PARTS="decode ckpt suite forward"] bash bench/results/s29/run1.sh <commit>
#   (PARTS: which sections run, in that order: decode = 1, forward = 2, ckpt = 3, suite = 4; raw.tgz
#   is rewritten after each, so a call cut short keeps what it finished)
# (builds: build-s29/s29a.tar.xz with m/ and d1/, s29b.tar.xz with d2/; bench/results/s29/README.md)
set -u
D=$OUT
S=$SECONDS
t() { echo "[$((SECONDS - S))s]"; }
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
tar -xJf build-s29/s29a.tar.xz -C build-s29
tar -xJf build-s29/s29b.tar.xz -C build-s29
M=build-s29/m
mkdir -p $D/raw/dec
pack() { tar czf $D/raw.tgz -C $D raw; }
decode() {
  echo "== 1. decode $(t)"
  for r in 1 2; do for b in m d1 d2; do
    build-s29/$b/kda_bench decode --reps 30 --json $D/raw/dec/${b}_$r.json > $D/raw/dec/${b}_$r.txt 2>&1
  done; done
  python3 bench/results/s27/dec_table.py $D/raw/dec m d1 d2
  local N=build-s29/d2
  timeout 100 $N/test_cuda_decode > $D/raw/test_cuda_decode_d2.log 2>&1
  echo "d2 test_cuda_decode rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/test_cuda_decode_d2.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/test_cuda_decode_d2.log) $(t)"
  grep -E "^\[  FAILED|Failure" $D/raw/test_cuda_decode_d2.log | head -5
  for tool in memcheck racecheck; do
    timeout 90 compute-sanitizer --tool $tool $N/test_cuda_sanitize --gtest_filter='*Decode*' > $D/raw/san_d2_$tool.log 2>&1
    echo "d2 decode $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $D/raw/san_d2_$tool.log | tail -1) $(t)"
  done
}
forward() {
  echo "== 2. forward $(t)"
  for x in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool; do
    timeout 120 $M/$x > $D/raw/$x.log 2>&1
    echo "$x rc=$? ok=$(grep -cE '^\[       OK \]' $D/raw/$x.log) failed=$(grep -cE '^\[  FAILED  \]' $D/raw/$x.log) $(t)"
    grep -E "^\[  FAILED|Failure" $D/raw/$x.log | head -5
  done
  $M/kda_bench prefill --reps 10 --graph --json $D/raw/prefill_m.json > $D/raw/prefill_m.txt 2>&1
  grep -E "ms|case" $D/raw/prefill_m.txt | head -40
  echo "== 2b. filled rows under each plan $(t)"
  $M/kda_bench prefill --reps 10 --graph --plans auto,fused,prepared fixed96 fixed64 b16x2048_32 varlen6_96 \
    v1024x8_96 varlen6_64 v1024x8_64 --json $D/raw/plans_m.json > $D/raw/plans_m.txt 2>&1
  grep -E "ms|case" $D/raw/plans_m.txt | head -30
}
ckpt() {
  echo "== 3. checkpoint cost $(t)"
  printf '#!/bin/bash\nexec %s "$@" --ckpt 1024\n' "$PWD/$M/kda_bench" > /tmp/kda_bench_ckpt && chmod +x /tmp/kda_bench_ckpt
  OUT=$D/raw/ckpt bash scripts/ab_bench.sh $M/kda_bench /tmp/kda_bench_ckpt 2 -- prefill --reps 10 --graph \
    fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k long64k_32 | grep -v "^== round"
}
suite() {
  echo "== 4. Python suite $(t)"
  mkdir -p $D/py
  OUT=$D/py RUN_FLA=${RUN_FLA:-none} RUN6_LIMIT=$((590 - (SECONDS - S))) bash bench/results/s19/run6.sh ${COMMIT:-unknown} > /dev/null 2>&1
  cat $D/py/log_bench.txt
}
COMMIT=${1:-unknown}
for part in ${PARTS:-decode ckpt suite forward}; do $part; pack; done
rm -rf $D/raw
echo "== done $(t)"
