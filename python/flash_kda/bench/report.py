"""Results file (JSON), markdown report and plots.

The JSON holds one object: ``schema``, ``meta`` (commit, device, versions, command, date) and one
entry per part that ran: ``speed``, ``accuracy``, ``e2e``, each ``{"meta": ..., "rows": [...]}``.
Several files (e.g. one per part, from separate runs) merge into one: rows of a part from all of
them, a later file's row replacing an earlier row of the same case.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import sys

SCHEMA = "flash_kda.bench/1"
PLOT_FILES = {"speed": ["speed.png", "floor_ratio.png"], "accuracy": ["accuracy.png"], "e2e": ["e2e.png"]}
MATPLOTLIB_MISSING = ("matplotlib is not installed: no plots were written. Install it with "
                      "`pip install matplotlib` (or `pip install 'flash-kda[bench]'`), then rerun or run "
                      "`python -m flash_kda.bench report RESULTS.json --plots DIR`.")


# ---------------------------------------------------------------------------------------------
# metadata


def _git(*args):
    try:
        r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _version(module_name, dist_name=None):
    try:
        from importlib.metadata import version

        return version(dist_name or module_name)
    except Exception:
        mod = sys.modules.get(module_name)
        return getattr(mod, "__version__", None) if mod else None


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_meta(device, argv=None):
    """What a result depends on: commit (FLASH_KDA_COMMIT overrides git), device, versions."""
    import flash_kda

    commit = os.environ.get("FLASH_KDA_COMMIT") or _git("rev-parse", "HEAD")
    dirty = None
    if not os.environ.get("FLASH_KDA_COMMIT") and commit:
        status = _git("status", "--porcelain", "--untracked-files=no")
        dirty = bool(status) if status is not None else None
    meta = dict(
        commit=commit, dirty=dirty,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python -m flash_kda.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        backend=device, host=platform.node() or None, python=platform.python_version(),
        versions=dict(flash_kda=flash_kda.__version__, numpy=_version("numpy")),
        cpu=_cpu_name(), cpu_threads=os.cpu_count(),
    )
    if device == "cuda":
        import torch

        meta["device"] = torch.cuda.get_device_name()
        props = torch.cuda.get_device_properties(0)
        meta["sm_count"] = props.multi_processor_count
        meta["gpu_memory_gib"] = round(props.total_memory / 2 ** 30, 1)
        meta["versions"].update(torch=torch.__version__, cuda=torch.version.cuda, triton=_version("triton"),
                                fla=_version("fla", "flash-linear-attention") or _version("fla", "fla-core"))
    else:
        meta["device"] = f"{meta['cpu']} ({meta['cpu_threads']} hardware threads)"
    return meta


# ---------------------------------------------------------------------------------------------
# results file


def new_results(meta):
    return {"schema": SCHEMA, "meta": meta}


def write_json(results, path):
    """Writes atomically (a run stopped half-way leaves the last complete file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, default=_json_default)
    os.replace(tmp, path)


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# What makes two rows of a part the same measurement (a later file's row replaces an earlier one's).
_ROW_KEY = {
    "speed": lambda r: r.get("case"),
    "accuracy": lambda r: r.get("case"),
    "e2e": lambda r: (r.get("config"), r.get("tokens"), r.get("mlp"), r.get("layers")),
}


def _merge_part(name, old, new):
    """Rows of both, in first-seen order; a row of `new` replaces the row of `old` it repeats. The
    part keeps `old`'s meta and lists the other runs' metas under "also_from"."""
    key = _ROW_KEY[name]
    rows = {}
    for r in old.get("rows", []) + new.get("rows", []):
        rows[key(r)] = r  # dicts keep the first insertion's position
    meta = dict(old.get("meta", {}))
    meta["also_from"] = meta.get("also_from", []) + [new.get("meta", {})] + new.get("meta", {}).get("also_from", [])
    return {"meta": meta, "rows": list(rows.values())}


def load(paths):
    """Loads and merges results files: the first file's meta; each part's rows from every file having
    it (a later file's row replaces an earlier one of the same case)."""
    merged = None
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        if r.get("schema") != SCHEMA:
            raise ValueError(f"{p}: not a flash_kda.bench results file (schema {r.get('schema')!r})")
        if merged is None:
            merged = r
            continue
        for name in _ROW_KEY:
            if name in r:
                merged[name] = _merge_part(name, merged[name], r[name]) if name in merged else r[name]
    if merged is None:
        raise ValueError("no results files given")
    return merged


# ---------------------------------------------------------------------------------------------
# markdown


def _f(x, fmt="{:.3f}", none="–"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return fmt.format(x)


def _e(x):
    return _f(x, "{:.2e}", none="NaN")


def md_meta(meta, parts=None):
    v = meta.get("versions", {})
    vers = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    commit = meta.get("commit") or "unknown"
    if meta.get("dirty"):
        commit += " (with uncommitted changes)"
    lines = [f"- device: {meta.get('device')}" + (f", {meta['sm_count']} SMs" if meta.get("sm_count") else ""),
             f"- commit: `{commit}`; date: {meta.get('date')}" + (f"; seed {meta['seed']}" if "seed" in meta else ""),
             f"- versions: {vers}",
             f"- command: `{meta.get('command')}`"]
    for name, part in (parts or {}).items():
        pm = part.get("meta", {})
        for m in ([pm] if pm else []) + pm.get("also_from", []):
            if m is pm and m.get("command") == meta.get("command") and m.get("commit") == meta.get("commit") \
                    and m.get("device") == meta.get("device"):
                continue
            lines.append(f"- {name}{' (some rows)' if m is not pm else ''}: from another run: commit "
                         f"`{m.get('commit')}`, {m.get('device')}, {m.get('date')}, `{m.get('command')}`")
    return "\n".join(lines)


def md_speed(part):
    rows = part["rows"]
    meta = part.get("meta", {})
    cuda = meta.get("backend") == "cuda"
    has_fla = any("fla_ms" in r or "fla_skipped" in r for r in rows)
    has_anchor = any("anchor" in r for r in rows)
    floor_what = "device-to-device copy" if cuda else "host memcpy"
    head = ["case", "sequences", "H", "MB", f"floor ms ({floor_what})", "flash-kda ms (p10–p90)", "floor ratio"]
    if has_anchor:
        head += ["FlashKDA ratio", "goal"]
    if has_fla:
        head += ["fla ms", "fla ratio", "fla ÷ flash-kda", "out vs fla"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        o = r["impls"]["flash-kda"]
        cells = [f"`{r['case']}`", r["batch"], str(r["H"]), f"{r['bytes'] / 1e6:.0f}", _f(r["floor_ms"]),
                 f"{o['median_ms']:.3f} ({o['p10_ms']:.3f}–{o['p90_ms']:.3f})", f"**{r['floor_ratio']:.2f}**"]
        if has_anchor:
            a = r.get("anchor") or {}
            cells += [_f(a.get("flashkda_ratio"), "{:.1f}"), _f(a.get("goal_ratio"), "≤ {:.1f}")]
        if has_fla:
            if "fla_ms" in r:
                cells += [_f(r["fla_ms"]), _f(r["fla_floor_ratio"], "{:.2f}"), _f(r["fla_over_ours"], "{:.2f}×"),
                          _e(r.get("ours_vs_fla_out_rel"))]
            else:
                cells += ["skipped" if "fla_skipped" in r else "–", "–", "–", "–"]
        out.append("| " + " | ".join(cells) + " |")
    reps = rows[0]["impls"]["flash-kda"]["reps"] if rows else 0
    if cuda:
        note = (f"Median of {reps} timed calls after warm-up, CUDA events around each call; flash-kda replayed "
                "from a CUDA graph (the Python layer's checks stay out of the time), fla called eagerly as "
                "users call it (`chunk_kda`, Triton, FLA_FLASH_KDA=0, safe gate, lower_bound −5, fp32 state). "
                "Floor = a device-to-device copy moving the same bytes (q, k, v, g, beta, out once each plus "
                "the fp32 initial and final state), measured in the same run; floor ratio = time ÷ floor "
                "(1.0 is the memory-bandwidth floor; lower is better). FlashKDA ratio and goal: BENCH.md. "
                "“out vs fla”: relative L2 difference of the two outputs.")
    else:
        note = (f"CPU backend (`backend=\"cpu\"`, fp32 chunked, multi-threaded). Median of {reps} calls after "
                "warm-up, `time.perf_counter`; floor = a host memcpy (`numpy.copyto`) of the same bytes in the "
                "same run.")
    skipped = [f"`{r['case']}` ({r['fla_skipped']})" for r in rows if "fla_skipped" in r]
    errors = [f"`{r['case']}`: {r['fla_error']}" for r in rows if "fla_error" in r]
    if skipped:
        note += " fla skipped on " + ", ".join(skipped) + "."
    if errors:
        note += " **fla errors:** " + "; ".join(errors) + "."
    return "\n".join(out) + "\n\n" + note


def md_accuracy(part):
    from .accuracy import LIMITS

    rows = part["rows"]
    impls = []
    for r in rows:
        for n in r["impls"]:
            if n not in impls:
                impls.append(n)
    head = ["case", "inputs", "sequences", "tokens", "H"]
    for n in impls:
        head += [f"{n} out", f"{n} state"]
    head += ["bf16 floor (out)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        seqs = (f"{r['N']} × {r['T'] // r['N']}" if r.get("lens") is None
                else f"{r['N']} (lengths {min(r['lens'])}–{max(r['lens'])})")
        cells = [f"`{r['case']}`", r["what"].replace("|", "\\|"), seqs, str(r["B"] * r["T"]),
                 str(r["H"]) + (f" ({r['heads_checked']} compared)" if r.get("heads_checked", r["H"]) < r["H"] else "")]
        for n in impls:
            m = r["impls"].get(n)
            if m is None:
                cells += ["–", "–"]
                continue
            cells += [_e(m["out_rel"]) + ("" if m["out_ok"] else " ✗"), _e(m["state_rel"]) + ("" if m["state_ok"] else " ✗")]
        cells.append(_e(r["bf16_out_floor"]))
        out.append("| " + " | ".join(cells) + " |")
    note = (f"Relative L2 error against the float64 recurrence (`flash_kda.reference`) on the same bf16 inputs, "
            f"fp32 initial and final state, lower_bound −5, over every token of the heads compared (the "
            f"reference computes the first 8; every element of every head must be written: outputs are "
            f"poisoned with NaN). Limits (SPEC.md): out ≤ {LIMITS['out']:g}, "
            f"fp32 state ≤ {LIMITS['state']:g} (goal {LIMITS['out_goal']:g} / {LIMITS['state_goal']:g}); ✗ marks "
            "a figure above the limit. bf16 floor = the error of rounding the exact out to bf16.")
    return "\n".join(out) + "\n\n" + note


def md_e2e(part):
    rows = part["rows"]
    head = ["model", "stack", "tokens", "fla ms", "flash-kda ms", "no-op ms", "f", "s (op)", "Amdahl",
            "measured", "dispatch"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        stack = f"{r['layers']} × (KDA" + (f" + MLP {r['intermediate']})" if r["mlp"] else ")")
        calls = r["flash_kda_calls_per_forward"]
        disp = "ok" if r["dispatch_ok"] else f"**FAILED** ({calls}; {r.get('dispatch_rejected', '')})"
        out.append("| " + " | ".join([
            f"`{r['config']}` (hidden {r['hidden']}, {r['heads']}×{r['head_dim']})", stack, str(r["tokens"]),
            _f(r["t_fla_ms"], "{:.2f}"), _f(r["t_flash_kda_ms"], "{:.2f}"), _f(r["t_noop_ms"], "{:.2f}"),
            _f(r["f"]), _f(r["s"], "{:.2f}×"), _f(r["amdahl"], "{:.3f}×"), f"**{r['measured']:.3f}×**", disp,
        ]) + " |")
    whats = {r["config"]: r["what"] for r in rows}
    note = ("Prefill of one sequence through a stack of fla's KDA layers (`fla.layers.KimiDeltaAttention`, safe gate, "
            "lower_bound −5, random weights, bf16) with pre-norm and residuals as in fla's `KDABlock`; “+ MLP” adds "
            "its SwiGLU MLP, dense with the width of the activated MoE experts. fla = fla's Triton `chunk_kda` "
            "(FLA_FLASH_KDA=0); flash-kda = fla's own dispatch to `flash_kda.fwd` (calls counted: “dispatch ok” "
            "means one call per layer); no-op = the KDA op replaced by an empty tensor of its output's shape. "
            "Medians of interleaved forwards under `torch.inference_mode()`. f = (fla − no-op) ÷ fla, the op's "
            "share; s = the op alone on the first layer's real inputs, fla ÷ flash-kda; Amdahl = 1 ÷ (1 − f + f ÷ s); "
            "measured = fla ÷ flash-kda for the whole stack.\n\n" + "\n".join(f"- `{k}`: {v}" for k, v in whats.items()))
    return "\n".join(out) + "\n\n" + note


def _worst(values):
    """The largest value; NaN (a non-finite result) when any is NaN."""
    return float("nan") if any(v != v for v in values) else max(values)


def md_summary(parts):
    """A few lines that say what the tables show."""
    lines = []
    sp = parts.get("speed")
    if sp and sp["rows"]:
        rows = sp["rows"]
        ratios = [r["floor_ratio"] for r in rows]
        text = f"- speed: floor ratio {min(ratios):.2f}–{max(ratios):.2f} over {len(rows)} cases"
        anchored = [r for r in rows if r.get("anchor")]
        if anchored:
            below = sum(r["floor_ratio"] < r["anchor"]["flashkda_ratio"] for r in anchored)
            goal = sum(r["floor_ratio"] <= r["anchor"]["goal_ratio"] for r in anchored)
            text += (f"; below FlashKDA's ratio on {below} of {len(anchored)} BENCH.md cases, at or under the "
                     f"goal on {goal}")
        fla = [r["fla_over_ours"] for r in rows if "fla_over_ours" in r]
        if fla:
            gm = math.exp(sum(math.log(x) for x in fla) / len(fla))
            text += (f"; fla ÷ flash-kda {min(fla):.2f}–{max(fla):.2f}× (geometric mean {gm:.2f}×, "
                     f"{len(fla)} cases)")
        lines.append(text)
    ac = parts.get("accuracy")
    if ac and ac["rows"]:
        names = []
        for r in ac["rows"]:
            names += [n for n in r["impls"] if n not in names]
        for n in names:
            ms = [r["impls"][n] for r in ac["rows"] if n in r["impls"]]
            worst_out, worst_state = (_worst([m[k] for m in ms]) for k in ("out_rel", "state_rel"))
            ok = all(m["out_ok"] and m["state_ok"] for m in ms)
            lines.append(f"- accuracy, {n}: worst out {_e(worst_out)}, worst final state {_e(worst_state)} over "
                         f"{len(ms)} input distributions ({'within' if ok else '**outside**'} SPEC.md's limits)")
    e2 = parts.get("e2e")
    if e2 and e2["rows"]:
        for r in e2["rows"]:
            lines.append(f"- end-to-end, {r['config']} {'+ MLP' if r['mlp'] else 'KDA only'}, {_tokens(r['tokens'])} "
                         f"tokens: measured {r['measured']:.3f}× (Amdahl {r['amdahl']:.3f}× from f = {r['f']:.3f}, "
                         f"s = {r['s']:.2f}×)" + ("" if r["dispatch_ok"] else " — **dispatch failed**"))
    return "\n".join(lines)


def markdown(results, image_prefix=None, title=None, images=True):
    """The report of a results object. `image_prefix`: where the PNGs are, relative to the markdown
    file (None: no images)."""
    parts = {k: results[k] for k in ("speed", "accuracy", "e2e") if k in results}
    s = []
    if title:
        s.append(f"# {title}\n")
    s.append("## Run\n")
    s.append(md_meta(results["meta"], parts) + "\n")
    summary = md_summary(parts)
    if summary:
        s.append("## Summary\n")
        s.append(summary + "\n")
    sections = [("speed", "Prefill speed", md_speed), ("accuracy", "Accuracy against float64", md_accuracy),
                ("e2e", "End-to-end prefill (fla KDA layer stack)", md_e2e)]
    for key, heading, fn in sections:
        if key not in parts:
            continue
        s.append(f"## {heading}\n")
        s.append(fn(parts[key]) + "\n")
        if images and image_prefix is not None:
            for png in PLOT_FILES[key]:
                s.append(f"![{png}]({_join(image_prefix, png)})\n")
    return "\n".join(s)


def _join(prefix, name):
    return name if prefix in ("", ".") else f"{prefix.rstrip('/')}/{name}"


# ---------------------------------------------------------------------------------------------
# plots


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(results, out_dir):
    """Writes the PNGs of the parts present into out_dir; returns their paths ([] without matplotlib)."""
    if not have_matplotlib():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    os.makedirs(out_dir, exist_ok=True)
    device = results["meta"].get("device", "")
    if "speed" in results:
        written += _plot_speed(plt, results["speed"], out_dir, device)
    if "accuracy" in results:
        written += _plot_accuracy(plt, results["accuracy"], out_dir, device)
    if "e2e" in results:
        written += _plot_e2e(plt, results["e2e"], out_dir, device)
    return written


def _save(plt, fig, out_dir, name):
    """Lays out, writes OUT_DIR/NAME and closes the figure; returns the path."""
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax, labels, series, log=False, errs=None):
    """Grouped bars: series = [(name, values, color)]; errs = {name: (lo, hi)} absolute."""
    import numpy as np

    n = len(series)
    width = 0.8 / max(n, 1)
    x = np.arange(len(labels))
    for i, (name, values, color) in enumerate(series):
        vals = [np.nan if v is None else v for v in values]
        yerr = None
        if errs and name in errs:
            lo, hi = errs[name]
            yerr = [[max(v - a, 0) if v is not None and a is not None else 0 for v, a in zip(values, lo)],
                    [max(b - v, 0) if v is not None and b is not None else 0 for v, b in zip(values, hi)]]
        ax.bar(x + (i - (n - 1) / 2) * width, vals, width, label=name, color=color, yerr=yerr, capsize=2)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30, ha="right")
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    return x, width


def _plot_speed(plt, part, out_dir, device):
    rows = part["rows"]
    labels = [r["case"] for r in rows]
    cuda = part.get("meta", {}).get("backend") == "cuda"
    series = [("flash-kda", [r["ours_ms"] for r in rows], "C0")]
    errs = {"flash-kda": ([r["impls"]["flash-kda"]["min_ms"] for r in rows],
                          [r["impls"]["flash-kda"]["max_ms"] for r in rows])}
    if any("fla_ms" in r for r in rows):
        series.append(("fla (Triton)", [r.get("fla_ms") for r in rows], "C1"))
    if any("anchor" in r for r in rows):
        series.append(("FlashKDA (BENCH.md)", [(r.get("anchor") or {}).get("flashkda_ms") for r in rows], "C2"))
    series.append(("floor (copy of the same bytes)", [r["floor_ms"] for r in rows], "0.6"))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.5))
    _bars(ax, labels, series, errs=errs)
    ax.set_ylabel("ms per call (median; flash-kda: min–max)")
    ax.set_title(f"Prefill time per case — {device}")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    ax.legend(fontsize=8, loc="upper left", framealpha=0.9, ncol=2)
    p1 = _save(plt, fig, out_dir, "speed.png")

    series = [("flash-kda", [r["floor_ratio"] for r in rows], "C0")]
    if any("fla_ms" in r for r in rows):
        series.append(("fla (Triton)", [r.get("fla_floor_ratio") for r in rows], "C1"))
    if any("anchor" in r for r in rows):
        series.append(("FlashKDA (BENCH.md)", [(r.get("anchor") or {}).get("flashkda_ratio") for r in rows], "C2"))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.5))
    x, width = _bars(ax, labels, series)
    goals = [(r.get("anchor") or {}).get("goal_ratio") for r in rows]
    if any(g is not None for g in goals):
        for xi, g in zip(x, goals):
            if g is not None:
                ax.hlines(g, xi - 0.45, xi + 0.45, colors="k", linestyles="--", linewidth=1)
        ax.plot([], [], "k--", linewidth=1, label="goal (BENCH.md)")
    ax.axhline(1.0, color="0.5", linewidth=0.8)
    ax.set_ylabel("time ÷ copy floor (lower is better)")
    ax.set_title(f"Floor ratio per case — {device}" + ("" if cuda else " (host memcpy floor)"))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    ax.legend(fontsize=8, loc="upper left", framealpha=0.9, ncol=2)
    p2 = _save(plt, fig, out_dir, "floor_ratio.png")
    return [p1, p2]


def _plot_accuracy(plt, part, out_dir, device):
    from .accuracy import LIMITS

    rows = part["rows"]
    labels = [r["case"] for r in rows]
    impls = []
    for r in rows:
        for n in r["impls"]:
            if n not in impls:
                impls.append(n)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(rows) + 3), 4.5))
    styles = [("C0", "o"), ("C1", "s"), ("C3", "^"), ("C4", "v")]
    x = list(range(len(rows)))
    for ax, key, limit, what in ((axes[0], "out_rel", LIMITS["out"], "out"),
                                 (axes[1], "state_rel", LIMITS["state"], "final state (fp32)")):
        n = len(impls) + (key == "out_rel")
        step = 0.5 / max(n, 1)
        vals = [limit]
        for i, name in enumerate(impls):
            y = [r["impls"].get(name, {}).get(key) for r in rows]
            y = [float("nan") if v is None else v for v in y]
            color, marker = styles[i % len(styles)]
            ax.plot([xi + (i - (n - 1) / 2) * step for xi in x], y, linestyle="none", marker=marker, color=color,
                    markersize=7, label=name)
            vals += [v for v in y if v == v and v > 0]
        if key == "out_rel":
            y = [r["bf16_out_floor"] for r in rows]
            ax.plot([xi + (n - 1 - (n - 1) / 2) * step for xi in x], y, linestyle="none", marker="_", color="0.3",
                    markersize=14, markeredgewidth=2, label="bf16 rounding of the exact out")
            vals += [v for v in y if v > 0]
        ax.axhline(limit, color="r", linestyle="--", linewidth=1, label=f"SPEC limit {limit:g}")
        ax.set_yscale("log")
        ax.set_ylim(min(vals) / 3, max(vals) * 3)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=30, ha="right")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.set_title(f"{what}: rel. L2 error vs float64")
        ax.legend(fontsize=7)
    fig.suptitle(f"Accuracy — {device}", fontsize=10)
    return [_save(plt, fig, out_dir, "accuracy.png")]


def _tokens(t):
    return f"{t / 1024:g}K" if t >= 1024 else str(t)


def _plot_e2e(plt, part, out_dir, device):
    rows = part["rows"]
    labels = [f"{r['config']}\n{'+MLP' if r['mlp'] else 'KDA only'}, {_tokens(r['tokens'])}" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(max(9, 2.0 * len(rows) + 3), 4.8))
    _bars(axes[0], labels, [("fla (Triton)", [1.0 for r in rows], "C1"),
                            ("flash-kda", [r["t_flash_kda_ms"] / r["t_fla_ms"] for r in rows], "C0"),
                            ("no-op KDA (the rest of the stack)", [r["t_noop_ms"] / r["t_fla_ms"] for r in rows], "0.6")])
    for i, r in enumerate(rows):
        axes[0].annotate(f"{r['t_fla_ms']:.1f} ms", (i, 1.0), ha="center", va="bottom", fontsize=6)
    axes[0].set_ylabel("stack time ÷ fla's stack time (median)")
    axes[0].set_title("Layer-stack prefill time (fla = 1)")
    axes[0].legend(fontsize=7, loc="lower right")
    _bars(axes[1], labels, [("kernel speedup s", [r["s"] for r in rows], "C2"),
                            ("Amdahl 1/(1-f+f/s)", [r["amdahl"] for r in rows], "C4"),
                            ("measured", [r["measured"] for r in rows], "C0")])
    axes[1].axhline(1.0, color="0.5", linewidth=0.8)
    axes[1].set_ylabel("speedup over fla (×)")
    axes[1].set_title("Speedup: kernel, predicted, measured")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
        for lab in ax.get_xticklabels():
            lab.set_rotation(0)
            lab.set_ha("center")
    fig.suptitle(f"End-to-end — {device}", fontsize=10)
    return [_save(plt, fig, out_dir, "e2e.png")]
