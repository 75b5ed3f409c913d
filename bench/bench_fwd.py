"""Kept for old command lines: the prefill benchmark now lives in the package.

    python bench/bench_fwd.py [ARGS...]   ==   python -m flash_kda.bench speed [ARGS...]

(--cases, --fla, --reps and --json keep their meaning; see `python -m flash_kda.bench --help`.)
"""
import sys

from flash_kda.bench import main

if __name__ == "__main__":
    sys.exit(main(["speed", *sys.argv[1:]]))
