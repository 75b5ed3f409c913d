"""Summarises Nsight Compute's per-source-line CSV (`ncu --page source --print-source cuda --csv`):
warp-stall samples per role of the sm90 forward (by source file) and the lines with the most.

    python scripts/ncu_lines.py FILE.csv [--top N]

The CSV's columns vary between ncu versions; the script finds the source-text column, the file
and line columns when present, and every numeric column whose name mentions stall sampling. With
none of those it prints the header it got and exits 1 (so the raw CSV can be read instead).
"""

import argparse
import csv
import io
import sys
from collections import defaultdict

ROLES = [("producer", "kda_fwd_producer"), ("consumer", "kda_fwd_consumer"), ("loader", "kda_rec"),
         ("chain", "kda_chain"),
         ("scheduler", "kda_fwd_scheduler"), ("ptx helpers", "ptx.cuh"), ("kernel", "kda_fwd_kernel")]


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_rows(path):
    with open(path, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    # ncu prints its own log lines before the CSV: start at the first line that looks like a header
    start = next((i for i, line in enumerate(lines) if line.startswith('"') and "," in line), None)
    if start is None:
        return [], []
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = next(reader, [])
    return header, [r for r in reader if len(r) == len(header)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    header, rows = read_rows(args.csv)
    low = [h.lower() for h in header]
    samples = [i for i, h in enumerate(low) if "sampl" in h and "stall" in h]
    total_col = next((i for i in samples if "not issued" not in low[i] and "all" in low[i]), None)
    if total_col is None and samples:
        total_col = samples[0]
    src_col = next((i for i, h in enumerate(low) if h in ("source", "# source", "source code")), None)
    file_col = next((i for i, h in enumerate(low) if "file" in h), None)
    line_col = next((i for i, h in enumerate(low) if h in ("line", "#", "line number")), None)
    if total_col is None or src_col is None:
        print(f"{args.csv}: no stall-sampling or source column; header: {header}")
        return 1

    # Without a file column, the current file is the last row naming a .cu/.cuh file.
    per_role = defaultdict(float)
    per_line = []
    current_file = ""
    for r in rows:
        src = r[src_col]
        if file_col is not None:
            current_file = r[file_col]
        elif number(r[total_col]) is None:
            # a row naming the file whose lines follow (ncu prints one per file in some versions)
            path = next((c.strip() for c in r if ".cu" in c), None)
            if path:
                current_file = path
            continue
        n = number(r[total_col])
        if not n:
            continue
        role = next((name for name, key in ROLES if key in current_file), "other")
        per_role[role] += n
        where = f"{current_file.rsplit('/', 1)[-1]}:{r[line_col]}" if line_col is not None else current_file
        per_line.append((n, role, where, src.strip()))
    total = sum(per_role.values()) or 1.0
    print(f"{args.csv}: {int(total)} stall samples ({header[total_col]})")
    for role, n in sorted(per_role.items(), key=lambda x: -x[1]):
        print(f"  {role:<12} {n / total:6.1%}")
    print(f"top {args.top} lines:")
    for n, role, where, src in sorted(per_line, key=lambda x: -x[0])[:args.top]:
        print(f"  {n / total:6.1%}  {role:<9} {where:<32} {src[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
