#!/bin/bash
# device run 1 (session 22): the GPU tests under every plan of P (013a686, run2.sh) from
# prebuilt binaries (build-dev/s22.tar.xz, s22/p), then for main at the start ($1 = 02bde0b, code of c302cc7) the Python speed suite
# (bench/results/s21/run2.sh: pip install ., `python -m flash_kda.bench speed --cases gpu`, FlashKDA
# and fla timed in the same run).
set -u
D=$OUT
mkdir -p $D/tests $D/suite
exec > >(tee $D/log.txt) 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
(cd build-dev && tar -xJf s22.tar.xz)
SANITIZERS= bash scripts/gpu_tests_prebuilt.sh build-dev/s22/p /tmp/tests 2>&1 | grep -v "^  cuda"
tar czf $D/tests/logs.tgz -C /tmp/tests .
OUT=$D/suite RUN6_LIMIT=${RUN6_LIMIT:-440} bash bench/results/s21/run2.sh $1
