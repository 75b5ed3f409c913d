#!/bin/bash
# Session 28, call 5: m3 = m2 with the unit's index arithmetic done once (thread 0 takes every thread's
# token view and adds only the liveness and the read slot; m2 computed the divisions twice), against
# m2 and h (5551104).
#   1. the decode table, h, m2 and m3 alternating, two rounds;
#   2. m3's decode GPU tests, memcheck and racecheck on its decode sanitizer cases.
#   OUT=<dir> bash bench/results/s28/run5.sh
# (builds: build-s28/s28d.tar.xz with m3/, s28c with m2/, build-s27/s27a.tar.xz with h/)
OLD=m2 OLD_TAR=s28c NEW=m3 NEW_TAR=s28d exec bash "$(dirname "$0")/run4.sh"
