#!/bin/bash
# device run 8 (session 19): run7.sh (the fp16 M A/B, tests, sanitizers), then run6.sh (the Python
# speed suite with FlashKDA and fla) of commit $1, each into a subfolder of the output.
set -u
D=$OUT
mkdir -p $D/r7 $D/r6
OUT=$D/r7 bash bench/results/s19/run7.sh
OUT=$D/r6 RUN_FLA="${RUN_FLA:-h8_8k h4_64k fixed32}" bash bench/results/s19/run6.sh $1
