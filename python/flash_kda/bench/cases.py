"""The benchmark's problems: the prefill suite on CUDA (the prefill cases and the serving shapes,
read from the data file cases.json beside this module, which the C++ benchmark
bench/cpp/kda_bench.cu reads too), a smaller suite for the CPU backend, custom shapes from the command line, and the
accuracy suite.

A case is a plain dict: ``name``, ``H`` (= HV), and either ``lens`` (a packed varlen batch: B = 1,
T = sum(lens), cu_seqlens) or ``B`` and ``T`` (a fixed batch of B sequences of T tokens); suite
cases may also carry targets (``goal_ratio``, ``goal_ms``) and published times (``published``).
K = V = 128 throughout (kda_bench adds K = V = 64 cases of its own: fixed96_d64, fixed16_d64).
"""

from __future__ import annotations

import importlib.resources
import itertools
import json
import re

K = 128
SCALE = K ** -0.5  # scale of every benchmark call
LOWER_BOUND = -5.0  # the safe gate's floor of every benchmark call

# The prefill suite on CUDA: the one list of cases, in the data file cases.json beside this module
# (shipped with the package; bench/cpp/kda_bench.cu's `prefill` reads the same file, through a header
# CMake generates from it: cmake/BenchCases.cmake). Read by the speed suite, its report and plots,
# and the command line (--cases NAME, or a group: prefill, serving, gpu). Grouped by H, largest
# first, so that fla autotunes once per H. Beside the shape, each case may carry the project's
# target for it (`goal_ratio`: a floor ratio; `goal_ms`: a time in ms on an H200, for the serving
# shapes, where few heads leave the memory floor tiny and the walk over a sequence's chunks is the
# whole call) and other libraries' published H200 times in ms (`published`, see PUBLISHED).
CASES_FILE = "cases.json"
CASE_GROUPS = ("prefill", "serving", "tool_only")
CASE_FIELDS = ("name", "B", "T", "lens", "H", "goal_ratio", "goal_ms", "published", "gate")
GATES = ("safe", "softplus")  # "safe": lower_bound = LOWER_BOUND (the default); "softplus": unbounded


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_case(case, where="case"):
    """Raises ValueError unless `case` (a dict of the data file, with its name) is well formed: the
    fields of CASE_FIELDS only, a name, H, either lens or B and T (positive integers), numeric goals,
    published times by source, a gate of GATES. The rules of cmake/BenchCases.cmake."""
    name = case.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(f"{where}: expected a \"name\" of letters, digits and _ (got {name!r})")
    where = f"{where} {name}"
    unknown = [k for k in case if k not in CASE_FIELDS]
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(CASE_FIELDS)})")
    if not _positive_int(case.get("H")):
        raise ValueError(f"{where}: H must be a positive integer")
    if "lens" in case:
        if "B" in case or "T" in case:
            raise ValueError(f"{where}: give either lens or B and T")
        lens = case["lens"]
        if not isinstance(lens, list) or not lens or not all(_positive_int(n) for n in lens):
            raise ValueError(f"{where}: lens must be a non-empty list of positive integers")
    elif not (_positive_int(case.get("B")) and _positive_int(case.get("T"))):
        raise ValueError(f"{where}: give either lens or B and T (positive integers)")
    for key in ("goal_ratio", "goal_ms"):
        if key in case and (isinstance(case[key], bool) or not isinstance(case[key], (int, float))
                            or not case[key] > 0):
            raise ValueError(f"{where}: {key} must be a positive number")
    published = case.get("published", {})
    if not isinstance(published, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in published.values()):
        raise ValueError(f"{where}: published must map sources to times in ms")
    if case.get("gate", "safe") not in GATES:
        raise ValueError(f"{where}: gate must be one of {', '.join(GATES)} (got {case['gate']!r})")


def load_cases(text=None):
    """{group: {name: case}} of the data file (`text`: its contents; default: the file shipped with
    the package), checked (check_case); a case is the file's dict without its name."""
    if text is None:
        text = importlib.resources.files(__package__).joinpath(CASES_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    groups, seen = {}, set()
    for group in CASE_GROUPS:
        entries = data.get(group)
        if not isinstance(entries, list):
            raise ValueError(f"{CASES_FILE}: no list {group!r}")
        groups[group] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ValueError(f"{CASES_FILE}: {group}[{i}] is not an object")
            check_case(entry, f"{CASES_FILE}: {group}[{i}]")
            if entry["name"] in seen:
                raise ValueError(f"{CASES_FILE}: case {entry['name']}: the name is used twice")
            seen.add(entry["name"])
            groups[group][entry["name"]] = {k: v for k, v in entry.items() if k != "name"}
    return groups


_FILE_CASES = load_cases()
PREFILL_CASES = _FILE_CASES["prefill"]
# Serving shapes: the heads one GPU holds under tensor parallelism, long prompts, packed batches
# that one long prompt dominates (cases.json, "serving_about").
SERVING_CASES = _FILE_CASES["serving"]
# Timed by kda_bench prefill alone (the softplus gate's cost on a few shapes); not part of the
# Python suite, which times the safe gate (lower_bound = LOWER_BOUND).
TOOL_ONLY_CASES = _FILE_CASES["tool_only"]

GPU_CASES = {**PREFILL_CASES, **SERVING_CASES}

# Where the published times come from.
PUBLISHED = {
    "cuLA": ("cuLA (inclusionAI/cuLA): the H200 times of its own benchmark table, with its intra-card "
             "context parallelism; not measured here"),
}

# The fields of a case that make its shape (a case of another name or shape carries no target).
SHAPE_KEYS = ("B", "T", "H", "lens")

# The CPU suite: the GPU suite's kinds of batch at a quarter of the tokens and H = 8 (a few tens
# of ms each on a few cores).
CPU_CASES = {
    "fixed8": dict(B=1, T=2048, H=8),
    "varlen6_8": dict(lens=[325, 137, 512, 241, 68, 766], H=8),
    "v256x8_8": dict(lens=[256] * 8, H=8),
    "b4x512_8": dict(B=4, T=512, H=8),
    "long8k_2": dict(B=1, T=8192, H=2),
}

# Accuracy suite: input distributions of docs/spec.md's test list. "transform" is applied to the
# normal draws before rounding to bf16 ("v*100": large |v|; "g+8": strong decay with
# lower_bound -5; "g-7": weak decay, a long memory). Lengths of "many_short" are drawn per run.
ACCURACY_CASES = {
    "normal": dict(B=1, T=2048, H=8, transform=None, what="normal inputs"),
    "large_v": dict(B=1, T=2048, H=8, transform="v*100", what="large |v|: v x 100"),
    "strong_decay": dict(B=1, T=2048, H=8, transform="g+8", what="strong decay: g + 8"),
    "weak_decay_long": dict(B=1, T=4096, H=4, transform="g-7", what="weak decay over a long sequence: g - 7"),
    "many_short": dict(nseq=64, max_len=128, H=8, transform=None,
                       what="many short sequences (64, lengths 1..128)"),
}


def expand(case):
    """(B, T, N, cu_seqlens list or None) of a case."""
    if case.get("lens") is not None:
        lens = list(case["lens"])
        return 1, sum(lens), len(lens), list(itertools.accumulate([0] + lens))
    return case["B"], case["T"], case["B"], None


def nbytes(case, state_bytes=4):
    """The bytes a call must move at least (the floor's copy moves as many): q, k, v, g (bf16
    [B,T,H,K]), beta (bf16 [B,T,H]), out (bf16) once each, plus the initial and final state
    ([N,H,V,K], fp32)."""
    B, T, N, _ = expand(case)
    H = case["H"]
    return B * T * H * (4 * 2 * K + 2 + 2 * K) + 2 * N * H * K * K * state_bytes


def describe(case):
    """Short text of a case's batch: '1 x 8192', '16 x 2048', or the varlen lengths ('8 x 1024
    (varlen)', '1300, 547, 2048', '20000 + 15 x 300')."""
    if case.get("lens") is not None:
        lens = case["lens"]
        if len(set(lens)) == 1 and len(lens) > 1:
            return f"{len(lens)} x {lens[0]} (varlen)"
        if len(lens) <= 8:
            return ", ".join(str(n) for n in lens)
        runs = [(n, len(list(group))) for n, group in itertools.groupby(lens)]
        if len(runs) <= 4:
            return " + ".join(str(n) if count == 1 else f"{count} x {n}" for n, count in runs)
        return f"{len(lens)} seqs, {sum(lens)} tokens"
    return f"{case['B']} x {case['T']}"


def _parse_lens(text):
    """'1300+547+2048' or '1024x8' or '1300:547:1024x2' -> list of ints."""
    out = []
    for part in re.split(r"[+:/;]", text):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:[x*](\d+))?", part)
        if not m:
            raise ValueError(f"bad sequence length {part!r} in lens={text!r} (expected e.g. 1300+547 or 1024x8)")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    if not out or any(n < 1 for n in out):
        raise ValueError(f"lens={text!r}: expected positive lengths")
    return out


def parse_shape(text):
    """A custom case from 'T=8192,H=48' / 'B=4,T=2048,H=32' / 'lens=1300+547+2048,H=64' /
    'lens=1024x8,H=96,name=mine'. Defaults: B=1, H=32, T=8192."""
    fields = {}
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise ValueError(f"--shape {text!r}: expected KEY=VALUE items (B, T, H, lens, name)")
        key, value = (s.strip() for s in item.split("=", 1))
        key = key.lower() if key.lower() in ("lens", "name") else key.upper()
        if key not in ("B", "T", "H", "lens", "name"):
            raise ValueError(f"--shape {text!r}: unknown key {key!r} (expected B, T, H, lens, name)")
        fields[key] = value
    case = {"H": int(fields.get("H", 32))}
    if "lens" in fields:
        if "T" in fields or "B" in fields:
            raise ValueError(f"--shape {text!r}: give either lens or B/T")
        case["lens"] = _parse_lens(fields["lens"])
        default_name = f"lens{len(case['lens'])}x{sum(case['lens'])}_{case['H']}"
    else:
        case["B"], case["T"] = int(fields.get("B", 1)), int(fields.get("T", 8192))
        default_name = (f"b{case['B']}x" if case["B"] > 1 else "t") + f"{case['T']}_{case['H']}"
    for key in ("B", "T", "H"):
        if key in case and case[key] < 1:
            raise ValueError(f"--shape {text!r}: {key} must be >= 1")
    case["name"] = fields.get("name", default_name)
    return case


GROUPS = {"gpu": GPU_CASES, "prefill": PREFILL_CASES, "serving": SERVING_CASES, "cpu": CPU_CASES}


def targets(case):
    """The suite's goal and published times of a case ({} when it has none, or when it is not the
    suite's case of that name: another shape under the same name carries nothing)."""
    suite_case = GPU_CASES.get(case.get("name"))
    if suite_case is None or any(case.get(k) != suite_case.get(k) for k in SHAPE_KEYS):
        return {}
    return {k: suite_case[k] for k in ("goal_ratio", "goal_ms", "published") if k in suite_case}


def select(names, suite):
    """Cases by name from a suite ({name: case}); 'all' is the whole suite."""
    if not names or names == ["all"]:
        return [dict(case, name=n) for n, case in suite.items()]
    unknown = [n for n in names if n not in suite]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(suite)}")
    return [dict(suite[n], name=n) for n in names]
