#!/usr/bin/env bash
# The full benchmark of BENCHMARK_H200.md on one GPU (H200 or H100), from the repository root:
#   1. pip install . (builds the CUDA kernels and the binding for this machine's Python);
#   2. python -m flash_kda.bench all, in one process so that fla autotunes each head count once:
#      the prefill speed suite (prefill cases and serving shapes; the copy floor, fla's Triton
#      chunk_kda and FlashKDA timed in the same run on the same inputs where they are importable),
#      the accuracy suite against float64 (flash-kda and fla), and the end-to-end fla KDA layer
#      stacks (Kimi-Linear-like with the safe gate and with its softplus gate, Kimi-K3-like; 8K and
#      32K tokens);
#   3. the report: OUT/bench.json, OUT/BENCHMARK_H200.md, OUT/{speed,floor_ratio,accuracy,e2e}.png
#      and OUT/run.log.
#
# Needs an sm_90 GPU, the CUDA toolkit and torch with CUDA; for the fla columns and the end-to-end
# part flash-linear-attention (`pip install flash-linear-attention`); for the FlashKDA columns
# FlashKDA's extension module flash_kda_C importable (e.g. its folder on PYTHONPATH). With fla, the
# whole run takes about 20 minutes, most of it fla's autotuning (1-2 minutes per head count).
#
# Usage:   bash bench/run_h200.sh
# Then, to update the repository's copy of the results:
#   cp OUT/bench.json OUT/*.png OUT/run.log bench/results/h200/ && cp OUT/BENCHMARK_H200.md .
# BENCHMARK_H200.md can be regenerated from the JSON at any time (no GPU needed):
#   python -m flash_kda.bench report bench/results/h200/bench.json --md BENCHMARK_H200.md \
#     --plots bench/results/h200 --title "flash-kda on an H200" --preamble bench/h200_preamble.md
#
# Knobs (environment):
#   PARTS       benchmark parts (default "speed accuracy e2e"). Results of several runs merge:
#               `python -m flash_kda.bench report A/bench.json B/bench.json --json merged.json ...`
#   OUT         output folder (default /tmp/flash_kda_h200)
#   FLA_CASES   the speed cases fla is timed on: "all" (default), "none", or case names
#   REPS        timed calls per measurement (default 30)
#   E2E_TOKENS  end-to-end prefill lengths (default "8192 32768")
#   TIMEOUT     stop the benchmark after this many seconds and report what finished (default: none)
#   WHEELS      a folder of wheels (e.g. fla's) to install first, for a machine without network access
#   SKIP_INSTALL=1   flash-kda is installed already
#   BENCH_ARGS  more options for `python -m flash_kda.bench` (e.g. "--cases serving")
# The commit recorded is the one `pip install .` built (git, or FLASH_KDA_COMMIT at install time for
# a source copy without .git).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flash_kda_h200}
WORK=$(mktemp -d /tmp/flash_kda_bench.XXXXXX)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

main() {
  SECONDS=0
  echo "== [${SECONDS}s] $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  if [[ -n ${WHEELS:-} ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl &&
      export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  if [[ -z ${SKIP_INSTALL:-} ]]; then
    echo "== [${SECONDS}s] pip install ."
    if ! python3 -m pip install -q --no-build-isolation --no-deps . >"$WORK/pip.log" 2>&1; then
      tail -n 40 "$WORK/pip.log"
      return 1
    fi
  fi
  echo "== [${SECONDS}s] python -m flash_kda.bench ${PARTS:-all}"
  local run=(python3 -m flash_kda.bench ${PARTS:-all} --no-progress --fla ${FLA_CASES:-all}
             --reps "${REPS:-30}" --tokens ${E2E_TOKENS:-8192 32768} --out "$WORK/run" ${BENCH_ARGS:-})
  local status=0
  if [[ -n ${TIMEOUT:-} ]]; then
    timeout --signal=TERM --kill-after=10 "$TIMEOUT" "${run[@]}" || status=$?
    [[ $status == 124 ]] && echo "!! the benchmark ran out of its ${TIMEOUT}s: the report holds what finished"
  else
    "${run[@]}" || status=$?
  fi
  echo "== [${SECONDS}s] report"
  if [[ -f $WORK/run/bench.json ]]; then
    python3 -m flash_kda.bench report "$WORK/run/bench.json" --json "$OUT/bench.json" --plots "$OUT" \
      --images bench/results/h200 --md "$OUT/BENCHMARK_H200.md" --title "flash-kda on an H200" \
      --preamble bench/h200_preamble.md || status=1
  else
    echo "no results were written"
    status=1
  fi
  echo "== [${SECONDS}s] done (status $status); files: $(cd "$OUT" && ls | tr '\n' ' ')"
  return $status
}

main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
