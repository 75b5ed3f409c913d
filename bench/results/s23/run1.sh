#!/bin/bash
# device run 1 (session 23): h = main at the start (b7e5201), m = h + pacing of pass 1's R and P
# walks, m2 = m + early scheduling of the next kernel from the last wave of the preparation, pass 1
# (split plans) and the chain, m3 = m2 + the pair walks with output copying 512 bytes a step fewer
# (slot b's unused half cross block), x = m without the chain kernel (an attribution build: results wrong;
# what the chain costs a timed call). Shipped as build-dev/s23.tar.xz (s23/{h,m,m2,m3,x}/kda_bench,
# s23/m3/ GPU tests). A/B from CUDA graphs (three alternating rounds), then ncu (time and DRAM bytes
# of each kernel) of one long64k_32 call of h and m2. run2.sh: m3's tests.
set -u
D=$OUT
mkdir -p $D/ab
exec > >(tee $D/log1.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
SET=${SET:-s23}  # s24: the rebuilt set (bench/results/s24/README.md)
(cd build-dev && tar -xJf $SET.tar.xz)
B=build-dev/$SET
OUT=$D/ab bash scripts/ab_bench.sh $(for b in ${BUILDS:-$( [ $SET = s23 ] && echo h m m2 m3 x || echo h m m3 f x)}; do echo $B/$b/kda_bench; done) ${ROUNDS:-3} -- prefill --reps 10 --graph \
  ${CASES:-fixed32 long64k_32 fixed16 h8_8k h4_64k fixed96} | grep -v "^== round"
# The checkpoint cost (docs/serving.md; a checkpoint every 1,024 tokens against none) of the set's
# newest build, its two forms alternating in the same run (CKPT=0 skips; on by default for s24).
if [ "${CKPT:-$([ $SET = s23 ] && echo 0 || echo 1)}" = 1 ]; then
  CB=$B/${CKPT_BUILD:-f}/kda_bench
  printf '#!/bin/bash\nexec %s "$@" --ckpt 1024\n' "$PWD/$CB" > /tmp/kda_bench_ckpt && chmod +x /tmp/kda_bench_ckpt
  echo "== checkpoint cost: $CB with --ckpt 1024 (build 1) against without (build 0)"
  OUT=$D/ckpt bash scripts/ab_bench.sh $CB /tmp/kda_bench_ckpt 2 -- prefill --reps 10 --graph \
    ${CKPT_CASES:-fixed96 fixed32 fixed16 fixed12 h8_8k h4_64k} | grep -v "^== round"
fi
# Issue 11's rows under each plan (the fused kernel, which the automatic plan picks where the pairs
# fill the GPU, against the prepared plan, whose preparation has changed much since that choice was
# measured). PLANCMP=0 skips; on by default for s24.
if [ "${PLANCMP:-$([ $SET = s23 ] && echo 0 || echo 1)}" = 1 ]; then
  echo "== plans: $B/h/kda_bench --plans auto,fused,prepared"
  for r in 1 2; do
    $B/h/kda_bench prefill --reps 10 --graph --plans auto,fused,prepared --json $D/plans_$r.json \
      fixed96 varlen6_96 v1024x8_96 fixed64 varlen6_64 v1024x8_64 b16x2048_32 > $D/plans_$r.txt 2>&1
  done
  python3 - $D <<'PY'
import json, sys, statistics
d = sys.argv[1]
runs = [{(x["case"], x["plan"]): x["ours_ms_median"] for x in json.load(open(f"{d}/plans_{r}.json"))} for r in (1, 2)]
cases = list(dict.fromkeys(c for c, _ in runs[0]))  # in the order run
for c in cases:
    row = {p: statistics.median(x[(c, p)] for x in runs if (c, p) in x) for (cc, p) in runs[0] if cc == c}
    print(f"{c:<14} " + "  ".join(f"{p} {v:.4f}" for p, v in row.items()))
PY
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in ${NCU_CASES:-long64k_32}; do
  for b in ${NCU_BUILDS:-h m}; do
    timeout 100 $NCU --kernel-name regex:kda_ --launch-skip 5 --launch-count 5 \
      --metrics gpu__time_duration.sum,dram__bytes.sum,lts__t_bytes.sum \
      $B/$b/kda_bench prefill --reps 1 $c > $D/ncu_${c}_$b.txt 2>&1
    echo "== ncu $c $b"; grep -E "^  [a-z].*kda_|gpu__time|dram__bytes|lts__t_bytes" $D/ncu_${c}_$b.txt | sed 's/  */ /g;s/(KdaFwdArgs.*)//' | head -24
  done
done
