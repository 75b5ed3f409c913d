#!/bin/bash
# device run 6 (session 18): where the checkpoint instantiations' timed cost goes (issue 14): an nsys
# timeline of main's kda_bench (build-dev/m.tar.xz) on fixed16 and h8_8k without checkpoints and with
# --ckpt 131072 (the checkpoint kernels, no boundary reached): kernel durations and the gaps between them.
set -u
exec > >(tee $OUT/log.txt) 2>&1
(cd build-dev && tar -xJf m.tar.xz)
nvidia-smi --query-gpu=name --format=csv,noheader
# (the GPU machine has no nsys on PATH; the one under nsight-compute ran but its stats export gave no file here)
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
for c in fixed16 h8_8k; do
  for ck in 0 131072; do
    A=""; [[ $ck -gt 0 ]] && A="--ckpt $ck"
    timeout 60 $NSYS profile -o /tmp/p_${c}_$ck --force-overwrite true --trace cuda build-dev/M/kda_bench prefill --reps 10 $A $c > /dev/null 2>&1
    timeout 60 $NSYS stats --report cuda_gpu_trace --format csv -o /tmp/t_${c}_$ck /tmp/p_${c}_$ck.nsys-rep > /dev/null 2>&1
    f=$(ls /tmp/t_${c}_${ck}*.csv 2>/dev/null | head -1)
    [[ -n "$f" ]] && cp "$f" $OUT/trace_${c}_$ck.csv
    python3 - "$f" "$c" "$ck" <<'PY'
import csv, sys, statistics
f, c, ck = sys.argv[1:4]
if not f: print(c, ck, 'no trace'); sys.exit()
rows = list(csv.DictReader(open(f)))
ks = [r for r in rows if 'kda_' in r.get('Name', '')]
# group consecutive calls: each starts with kda_plan_kernel
calls, cur = [], []
for r in ks:
    if 'kda_plan_kernel' in r['Name'] and cur: calls.append(cur); cur = []
    cur.append(r)
if cur: calls.append(cur)
calls = calls[-10:]
def ns(r, k): return float(r[k])
spans = [ns(cl[-1], 'Start (ns)') + ns(cl[-1], 'Duration (ns)') - ns(cl[0], 'Start (ns)') for cl in calls]
print(f"{c} ckpt {ck}: {len(calls)} calls, median span {statistics.median(spans)/1e3:.1f} us")
cl = calls[len(calls)//2]
t0 = ns(cl[0], 'Start (ns)')
for r in cl:
    print(f"   {r['Name'][:60]:<60} start {(ns(r,'Start (ns)')-t0)/1e3:8.1f}  dur {ns(r,'Duration (ns)')/1e3:8.1f}")
PY
  done
done
