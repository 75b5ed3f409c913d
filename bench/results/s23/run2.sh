#!/bin/bash
# device run 2 (session 23, after run 1 on the same machine): m3's GPU tests under every plan
# (m3 holds m2's and m's changes), memcheck / racecheck of the forward's sanitizer cases under the
# automatic and 32-token plans; then the decode A/B of dec_run.sh (build-dev/dec.tar.xz).
set -u
D=$OUT
exec > >(tee $D/log2.txt) 2>&1
[ -d build-dev/s23 ] || (cd build-dev && tar -xJf s23.tar.xz)
SANITIZE_PLANS=${SANITIZE_PLANS:-auto,split32} bash scripts/gpu_tests_prebuilt.sh build-dev/s23/m3 /tmp/tests 2>&1 | grep -v "^  cuda"
tar czf $D/tests_m3.tgz -C /tmp/tests .
[ "${DEC:-1}" = 1 ] && [ -f build-dev/dec.tar.xz ] && OUT=$D/dec bash bench/results/s23/dec_run.sh
