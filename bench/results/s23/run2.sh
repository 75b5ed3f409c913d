#!/bin/bash
# run 2 (session 23, after run 1 on the same machine): m3's GPU tests under every plan (SET=s24: the
# rebuilt set, f's tests; m3 holds m2's and m's changes), memcheck / racecheck of the forward's sanitizer cases under the
# automatic and 32-token plans; then the decode A/B of dec_run.sh (build-dev/dec.tar.xz).
set -u
D=$OUT
exec > >(tee $D/log2.txt) 2>&1
SET=${SET:-s23}
# the set's tests may ship apart (${SET}t.tar.xz, e.g. s24t.tar.xz): extract whichever archive is here
for t in $SET ${SET}t; do [ -f build-dev/$t.tar.xz ] && (cd build-dev && tar -xJf $t.tar.xz); done
TB=${TESTS_BUILD:-$([ $SET = s23 ] && echo m3 || echo f)}  # the build whose GPU tests run
SANITIZE_PLANS=${SANITIZE_PLANS:-auto,split32} bash scripts/gpu_tests_prebuilt.sh build-dev/$SET/$TB /tmp/tests 2>&1 | grep -v "^  cuda"
tar czf $D/tests_$TB.tgz -C /tmp/tests .
[ "${DEC:-1}" = 1 ] && [ -f build-dev/dec.tar.xz ] && OUT=$D/dec bash bench/results/s23/dec_run.sh
