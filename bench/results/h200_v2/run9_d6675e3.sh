#!/bin/bash
set -u
echo "new = $(cat .devrun/commit) (d6675e3: pair prep Y in P3 + tests de-duplicated); oldt = tests at fa1be79; oldb = kda_bench at 32c3a99"
t0=$(date +%s); el() { echo "$(( $(date +%s)-t0 ))s"; }
mkdir -p /tmp/b && tar -xJf .devrun/bins.tar.xz -C /tmp/b && echo "untar $(el)"
B=/tmp/b
FLASH_KDA_GPU_PLANS=split32,prepared32 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 3 $B/newt/test_cuda_sanitize > $OUT/race.log 2>&1; echo "racecheck rc=$? $(el)"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" $OUT/race.log | head -3
export FLASH_KDA_TEST_SEED=20261202
for t in test_cuda_forward test_cuda_checkpoints test_cuda_prefill_pool test_cuda_decode test_cuda_context_parallel; do
  for v in newt oldt; do timeout 60 $B/$v/$t > /tmp/$v.$t.log 2>&1; echo "$v $t rc=$?"; done
  grep -vE "ms\)|ms total" /tmp/newt.$t.log > /tmp/n.txt; grep -vE "ms\)|ms total" /tmp/oldt.$t.log > /tmp/o.txt
  echo "  diff lines: $(diff /tmp/n.txt /tmp/o.txt | grep -c '^[<>]') of $(wc -l < /tmp/n.txt); $(grep -c ' ok$' /tmp/n.txt) ok; $(grep -cE 'FAIL' /tmp/n.txt) FAIL"
  diff /tmp/n.txt /tmp/o.txt > $OUT/diff_$t.txt; cp /tmp/newt.$t.log $OUT/$t.log
done
unset FLASH_KDA_TEST_SEED; el
C="fixed32 long64k_32 h4_64k fixed16 fixed12 h8_8k"
for r in 1 2; do for v in oldb newt; do timeout 40 $B/$v/kda_bench prefill --reps 10 --json $OUT/ab_${v}_$r.json $C > /tmp/ab_${v}_$r.txt 2>&1; done; done; echo "ab $(el)"
for r in 1 2; do paste <(grep -v seed /tmp/ab_oldb_$r.txt | cut -c1-48) <(grep -v seed /tmp/ab_newt_$r.txt | cut -c14-48); done
echo "prep new fixed32 / long64k_32: $(timeout 40 ncu -k regex:kda_prep --metrics gpu__time_duration.sum --csv $B/newt/kda_bench prefill --reps 1 fixed32 long64k_32 2>/dev/null | grep gpu__time | awk -F'","' '{print $NF}' | tr -d '"' | tr '\n' ' ') $(el)"
C="fixed96 fixed12 h8_8k fixed16 h4_64k fixed32"
for r in 1 2; do
  timeout 40 $B/newt/kda_bench prefill --reps 10 --plans auto,split16 --json $OUT/ck0_$r.json $C > /tmp/ck0_$r.txt 2>&1
  timeout 40 $B/newt/kda_bench prefill --reps 10 --plans auto --ckpt 1024 --json $OUT/ck1_$r.json $C > /tmp/ck1_$r.txt 2>&1
done; echo "ckpt $(el)"
for r in 1 2; do grep -v seed /tmp/ck0_$r.txt | cut -c1-50; grep -v seed /tmp/ck1_$r.txt | cut -c1-50; done
cp /tmp/ab_*.txt /tmp/ck*_*.txt $OUT/ 2>/dev/null
cd $OUT && tar czf all.tgz --exclude=all.tgz . && find . -type f ! -name all.tgz -delete
