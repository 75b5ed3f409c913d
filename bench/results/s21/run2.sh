#!/bin/bash
# device run 2 (session 21): the Python speed suite of the checkout (commit $1) on whatever card
# comes -- bench/results/s19/run6.sh (pip install ., then `python -m flash_kda.bench speed --cases gpu`
# with FlashKDA from .anchors/ and fla from .whl/ on the cases of $RUN_FLA timed in the same run).
set -u
RUN6_LIMIT=${RUN6_LIMIT:-560} RUN_FLA="${RUN_FLA:-h8_8k h4_64k fixed32}" bash bench/results/s19/run6.sh $1
