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

SCHEMA = "flash_kda.bench/2"
READABLE_SCHEMAS = ("flash_kda.bench/1", SCHEMA)  # /1: before FlashKDA and the targets were in the rows
PLOT_FILES = {"speed": ["speed.png", "floor_ratio.png"], "accuracy": ["accuracy.png"], "e2e": ["e2e.png"]}
MATPLOTLIB_MISSING = ("matplotlib is not installed: no plots were written. Install it with "
                      "`pip install matplotlib` (from a flash-kda source folder also `pip install '.[bench]'`), "
                      "then rerun or run `python -m flash_kda.bench report RESULTS.json --plots DIR`.")


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


def build_info():
    """What was measured: flash-kda's version and commit, as baked into the package when it was
    built (the module flash_kda._build_info, written by CMake), else from the git checkout the
    package is imported from (a source tree on PYTHONPATH), else unknown. Never the repository the
    shell happens to be in. Returns dict(version, commit, dirty, commit_from)."""
    import flash_kda

    try:
        from flash_kda import _build_info as baked
    except ImportError:
        baked = None
    info = dict(version=getattr(baked, "version", None) or flash_kda.__version__, commit=None, dirty=None,
                commit_from=None)
    if baked is not None and baked.commit:
        info.update(commit=baked.commit, dirty=baked.dirty, commit_from=f"build ({baked.commit_source})")
        return info
    package = os.path.dirname(os.path.abspath(flash_kda.__file__))
    top = _git("-C", package, "rev-parse", "--show-toplevel")
    if top and os.path.realpath(os.path.join(top, "python", "flash_kda")) == os.path.realpath(package):
        commit = _git("-C", top, "rev-parse", "HEAD")
        if commit:
            status = _git("-C", top, "status", "--porcelain", "--untracked-files=no")
            info.update(commit=commit, dirty=bool(status) if status is not None else None,
                        commit_from="the source checkout")
    return info


def collect_meta(device, argv=None):
    """What a result depends on: flash-kda's build (version, commit), device, versions."""
    build = build_info()
    meta = dict(
        commit=build["commit"], dirty=build["dirty"], commit_from=build["commit_from"],
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python -m flash_kda.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        backend=device, host=platform.node() or None, python=platform.python_version(),
        versions=dict(flash_kda=build["version"], numpy=_version("numpy")),
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
        if r.get("schema") not in READABLE_SCHEMAS:
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


def row_targets(row):
    """A speed row's goal and published times; rows of older results files held the goal in their
    "anchor"."""
    if "targets" in row:
        return row["targets"]
    goal = (row.get("anchor") or {}).get("goal_ratio")
    return {"goal_ratio": goal} if goal is not None else {}


def goal_text(targets):
    if "goal_ratio" in targets:
        return f"ratio ≤ {targets['goal_ratio']:.1f}"
    if "goal_ms" in targets:
        return f"≤ {targets['goal_ms']:.2f} ms"
    return "–"


def goal_met(row):
    """True / False against the row's goal, None without one."""
    t = row_targets(row)
    if "goal_ratio" in t:
        return row["floor_ratio"] <= t["goal_ratio"]
    if "goal_ms" in t:
        return row["ours_ms"] <= t["goal_ms"]
    return None


def published_sources(rows):
    names = []
    for r in rows:
        names += [n for n in row_targets(r).get("published", {}) if n not in names]
    return names


# The other implementations a speed row may hold: (name in the tables, key prefix of the row's fields).
OTHERS = (("FlashKDA", "flashkda"), ("fla", "fla"))


def md_speed(part):
    from .cases import PUBLISHED

    rows = part["rows"]
    meta = part.get("meta", {})
    cuda = meta.get("backend") == "cuda"
    others = [(name, key) for name, key in OTHERS if any(f"{key}_ms" in r or f"{key}_skipped" in r for r in rows)]
    has_goal = any(row_targets(r).get("goal_ratio") or row_targets(r).get("goal_ms") for r in rows)
    published = published_sources(rows)
    floor_what = "device-to-device copy" if cuda else "host memcpy"
    head = ["case", "sequences", "H", "MB", f"floor ms ({floor_what})", "flash-kda ms (p10–p90)", "floor ratio"]
    if has_goal:
        head += ["goal"]
    for name, _ in others:
        head += [f"{name} ms (floor ratio)", f"{name} ÷ flash-kda"]
    head += [f"{n} (published) ms" for n in published]
    head += [f"out vs {name}" for name, _ in others]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        o = r["impls"]["flash-kda"]
        t = row_targets(r)
        cells = [f"`{r['case']}`", r["batch"], str(r["H"]), f"{r['bytes'] / 1e6:.0f}", _f(r["floor_ms"]),
                 f"{o['median_ms']:.3f} ({o['p10_ms']:.3f}–{o['p90_ms']:.3f})", f"**{r['floor_ratio']:.2f}**"]
        if has_goal:
            met = goal_met(r)
            cells.append(goal_text(t) + ("" if met is None else (" ✓" if met else " ✗")))
        for _, key in others:
            if f"{key}_ms" in r:
                cells += [f"{r[f'{key}_ms']:.3f} ({r[f'{key}_floor_ratio']:.1f})", _f(r[f"{key}_over_ours"], "{:.2f}×")]
            else:
                cells += ["skipped" if f"{key}_skipped" in r else "–", "–"]
        cells += [_f(t.get("published", {}).get(n)) for n in published]
        cells += [_e(r.get(f"ours_vs_{key}_out_rel")) if f"{key}_ms" in r else "–" for _, key in others]
        out.append("| " + " | ".join(cells) + " |")
    reps = rows[0]["impls"]["flash-kda"]["reps"] if rows else 0
    if cuda:
        note = (f"Median of {reps} timed calls after warm-up, CUDA events around each call; flash-kda replayed "
                "from a CUDA graph (the Python layer's checks stay out of the time). Floor = a device-to-device "
                "copy moving the same bytes (q, k, v, g, beta, out once each plus the fp32 initial and final "
                "state), measured in the same run; floor ratio = time ÷ floor (1.0 is the memory-bandwidth "
                "floor; lower is better).")
        if has_goal:
            note += (" Goal: the project's target for the case, a floor ratio or, on the serving shapes (few "
                     "heads, where the floor is tiny), a time; ✓ met, ✗ not yet.")
        if any(key == "flashkda" for _, key in others):
            how = sorted({r.get("flashkda_timing", "") for r in rows if "flashkda_ms" in r} - {""})
            note += (" FlashKDA = MoonshotAI's FlashKDA (its extension `flash_kda_C`), on the same inputs with "
                     "fp32 states (which it rounds to bf16 inside), " + ("; ".join(how) if how else "timed the same way")
                     + ".")
        if any(key == "fla" for _, key in others):
            note += (" fla = flash-linear-attention's Triton `chunk_kda`, called eagerly as users call it "
                     "(FLA_FLASH_KDA=0, safe gate, lower_bound −5, fp32 state).")
        fk_info = part.get("flashkda") or {}
        if fk_info.get("timed") is False:
            note += (f" FlashKDA not timed ({fk_info.get('why')}): its extension `flash_kda_C` must be importable "
                     "(e.g. its folder on PYTHONPATH).")
        note += " “X ÷ flash-kda” > 1: flash-kda is faster. “out vs X”: relative L2 difference of the outputs."
        for n in published:
            note += f" {n} (published): {PUBLISHED.get(n, 'a published figure, not measured here')}."
    else:
        note = (f"CPU backend (`backend=\"cpu\"`, fp32 chunked, multi-threaded). Median of {reps} calls after "
                "warm-up, `time.perf_counter`; floor = a host memcpy (`numpy.copyto`) of the same bytes in the "
                "same run.")
    for name, key in others:
        skipped = [f"`{r['case']}` ({r[f'{key}_skipped']})" for r in rows if f"{key}_skipped" in r]
        if skipped:
            note += f" {name} skipped on " + ", ".join(skipped) + "."
    errors = [f"`{r['case']}`: {r['fla_error']}" for r in rows if "fla_error" in r]
    if errors:
        note += " **fla errors:** " + "; ".join(errors) + "."
    return "\n".join(out) + "\n\n" + note


def md_accuracy(part):
    from .accuracy import LIMITS
    from .cases import ACCURACY_CASES

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
        # the suite's current words for a known case (older files cite a file outside the repository)
        what = ACCURACY_CASES.get(r["case"], {}).get("what", r["what"])
        cells = [f"`{r['case']}`", what.replace("|", "\\|"), seqs, str(r["B"] * r["T"]),
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
            f"poisoned with NaN). Limits (docs/spec.md): out ≤ {LIMITS['out']:g}, "
            f"fp32 state ≤ {LIMITS['state']:g} (goal {LIMITS['out_goal']:g} / {LIMITS['state_goal']:g}); ✗ marks "
            "a figure above the limit. bf16 floor = the error of rounding the exact out to bf16.")
    return "\n".join(out) + "\n\n" + note


def e2e_gate(row):
    """The gate of an e2e row: "safe" (lower_bound -5, fla's dispatch) or "softplus" (flash_kda.chunk_kda);
    rows of older results files, from before the softplus stacks, are all "safe"."""
    return row.get("gate", "safe")


# How the flash-kda variant of an e2e row reached flash-kda (its "route"), as the table says it.
E2E_ROUTES = {"fla-dispatch": "fla's dispatch", "chunk_kda": "`flash_kda.chunk_kda`"}


def _e2e_route(row):
    return row.get("route", "fla-dispatch")


def md_e2e(part):
    rows = part["rows"]
    head = ["model", "gate", "stack", "tokens", "fla ms", "flash-kda ms", "no-op ms", "f", "s (op)", "Amdahl",
            "measured", "flash-kda calls"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        stack = f"{r['layers']} × (KDA" + (f" + MLP {r['intermediate']})" if r["mlp"] else ")")
        calls = r["flash_kda_calls_per_forward"]
        route = E2E_ROUTES.get(_e2e_route(r), _e2e_route(r))
        disp = (f"ok ({route})" if r["dispatch_ok"]
                else f"**FAILED** ({route}: {calls}; {r.get('dispatch_rejected', '')})")
        gate = "softplus (no bound)" if e2e_gate(r) == "softplus" else "safe (−5)"
        out.append("| " + " | ".join([
            f"`{r['config']}` (hidden {r['hidden']}, {r['heads']}×{r['head_dim']})", gate, stack, str(r["tokens"]),
            _f(r["t_fla_ms"], "{:.2f}"), _f(r["t_flash_kda_ms"], "{:.2f}"), _f(r["t_noop_ms"], "{:.2f}"),
            _f(r["f"]), _f(r["s"], "{:.2f}×"), _f(r["amdahl"], "{:.3f}×"), f"**{r['measured']:.3f}×**", disp,
        ]) + " |")
    whats = {r["config"]: r["what"] for r in rows}
    gates = {e2e_gate(r) for r in rows}
    note = ("Prefill of one sequence through a stack of fla's KDA layers (`fla.layers.KimiDeltaAttention`, random "
            "weights, bf16) with pre-norm and residuals as in fla's `KDABlock`; “+ MLP” adds its SwiGLU MLP, dense "
            "with the width of the activated MoE experts. fla = fla's Triton `chunk_kda` (FLA_FLASH_KDA=0); "
            "no-op = the KDA op replaced by an empty tensor of its output's shape. ")
    if "safe" in gates:
        note += ("Safe gate (−5): the layers' safe gate with lower_bound −5, which fla dispatches to flash-kda by "
                 "itself: flash-kda = fla's own dispatch to `flash_kda.fwd` (FLA_FLASH_KDA=1). ")
    if "softplus" in gates:
        note += ("Softplus (no bound): fla's unbounded gate −exp(A_log)·softplus(g + dt_bias) of Kimi-Linear-48B "
                 "(`safe_gate=False`, `lower_bound=None`, A_log and dt_bias as fla initialises them), which fla's "
                 "dispatch does not send to flash-kda: flash-kda = the layers' `chunk_kda` replaced by "
                 "`flash_kda.chunk_kda`, called with the same arguments. ")
    note += ("flash-kda calls: flash-kda's calls per forward are counted in every variant; “ok” means one per "
             "layer in the flash-kda variant and none in the others (the fla variant ran fla's Triton path). "
             "Medians of interleaved forwards under `torch.inference_mode()`. f = (fla − no-op) ÷ fla, the op's "
             "share; s = the op alone on the first layer's real inputs, fla ÷ flash-kda; "
             "Amdahl = 1 ÷ (1 − f + f ÷ s); measured = fla ÷ flash-kda for the whole stack.\n\n"
             + "\n".join(f"- `{k}`: {v}" for k, v in whats.items()))
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
        met = [goal_met(r) for r in rows if goal_met(r) is not None]
        if met:
            text += f"; at or under the goal on {sum(met)} of {len(met)} cases with one"
        for name, key in OTHERS:
            xs = [r[f"{key}_over_ours"] for r in rows if f"{key}_over_ours" in r]
            if xs:
                gm = math.exp(sum(math.log(x) for x in xs) / len(xs))
                text += (f"; {name} ÷ flash-kda {min(xs):.2f}–{max(xs):.2f}× (geometric mean {gm:.2f}×; "
                         f"flash-kda faster on {sum(x > 1 for x in xs)} of {len(xs)} cases)")
        for n in published_sources(rows):
            pub = [(r["ours_ms"], row_targets(r)["published"][n]) for r in rows
                   if n in row_targets(r).get("published", {})]
            text += (f"; faster than {n}'s published time on {sum(o < p for o, p in pub)} of {len(pub)} cases "
                     f"where it has one")
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
                         f"{len(ms)} input distributions ({'within' if ok else '**outside**'} the limits of docs/spec.md)")
    e2 = parts.get("e2e")
    if e2 and e2["rows"]:
        for r in e2["rows"]:
            gate = " (softplus gate)" if e2e_gate(r) == "softplus" else ""
            failed = (" — **dispatch failed**" if _e2e_route(r) == "fla-dispatch"
                      else " — **flash-kda calls not as expected**")
            lines.append(f"- end-to-end, {r['config']}{gate} {'+ MLP' if r['mlp'] else 'KDA only'}, "
                         f"{_tokens(r['tokens'])} tokens: measured {r['measured']:.3f}× (Amdahl {r['amdahl']:.3f}× "
                         f"from f = {r['f']:.3f}, s = {r['s']:.2f}×)" + ("" if r["dispatch_ok"] else failed))
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
    """Lays out, writes OUT_DIR/NAME (cropped to what is drawn, legends below the axes included) and
    closes the figure; returns the path."""
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def _title(fig, what, device, ax=None, fontsize=11):
    """A title that fits: `what` on the first line, the device below in a smaller font, wrapped to the
    width of the figure (or of `ax`'s share of it)."""
    import textwrap

    width_in = fig.get_figwidth() * (ax.get_position().width if ax is not None else 0.9)
    chars = max(30, int(width_in * 72 / (0.6 * (fontsize - 2))))  # ~0.6 em per character
    sub = "\n".join(textwrap.wrap(device, chars)) if device else ""
    text = what + (f"\n{sub}" if sub else "")
    if ax is None:
        fig.suptitle(text, fontsize=fontsize - 1)
    else:
        ax.set_title(text, fontsize=fontsize - 1)


# Bars of values spanning more than this factor are drawn on a log scale (the small ones stay visible).
LOG_SPAN = 20.0


def _wants_log(values):
    vals = [v for v in values if v is not None and v == v and v > 0]
    return bool(vals) and max(vals) / min(vals) > LOG_SPAN


def _bars(ax, labels, series, log=None, errs=None):
    """Grouped bars: series = [(name, values, style)], style a colour or a dict of bar options;
    errs = {name: (lo, hi)} absolute. log: None picks a log scale when the values span more than
    LOG_SPAN. Returns (x positions of the groups, bar width, whether the scale is log)."""
    import numpy as np

    if log is None:
        log = _wants_log([v for _, values, _ in series for v in values])
    n = len(series)
    width = 0.8 / max(n, 1)
    x = np.arange(len(labels))
    for i, (name, values, style) in enumerate(series):
        vals = [np.nan if v is None else v for v in values]
        yerr = None
        if errs and name in errs:
            lo, hi = errs[name]
            yerr = [[max(v - a, 0) if v is not None and a is not None else 0 for v, a in zip(values, lo)],
                    [max(b - v, 0) if v is not None and b is not None else 0 for v, b in zip(values, hi)]]
        opts = style if isinstance(style, dict) else {"color": style}
        ax.bar(x + (i - (n - 1) / 2) * width, vals, width, label=name, yerr=yerr, capsize=2, **opts)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30, ha="right")
    if log:
        ax.set_yscale("log")
        vals = [v for _, values, _ in series for v in values if v is not None and v == v and v > 0]
        ax.set_ylim(min(vals) / 2, max(vals) * 2)  # the smallest bar stays visible above the axis
        ax.grid(axis="y", which="both", alpha=0.3)
    else:
        ax.grid(axis="y", alpha=0.3)
    return x, width, log


def _legend_below(ax, ncol=3, below=-0.22):
    """The legend under the axes (and their tick labels), where it hides no bar."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, below), ncol=ncol, framealpha=0.9)


def _goal_marks(ax, x, goals, label):
    """A dashed line across each group with a goal (None: none); one legend entry."""
    if not any(g is not None for g in goals):
        return
    for xi, g in zip(x, goals):
        if g is not None:
            ax.hlines(g, xi - 0.45, xi + 0.45, colors="k", linestyles="--", linewidth=1)
    ax.plot([], [], "k--", linewidth=1, label=label)


# Colours of the implementations, the same in every plot.
COLORS = {"flash-kda": "C0", "FlashKDA": "C2", "fla": "C1"}
PUBLISHED_STYLE = dict(color="white", edgecolor="0.2", hatch="//", linewidth=0.8)


def _plot_speed(plt, part, out_dir, device):
    rows = part["rows"]
    labels = [r["case"] for r in rows]
    cuda = part.get("meta", {}).get("backend") == "cuda"
    size = (max(7, 1.2 * len(rows) + 2), 5)

    series = [("flash-kda", [r["ours_ms"] for r in rows], COLORS["flash-kda"])]
    errs = {"flash-kda": ([r["impls"]["flash-kda"]["min_ms"] for r in rows],
                          [r["impls"]["flash-kda"]["max_ms"] for r in rows])}
    for name, key in OTHERS:
        if any(f"{key}_ms" in r for r in rows):
            series.append((name if key != "fla" else "fla (Triton)", [r.get(f"{key}_ms") for r in rows], COLORS[name]))
    for n in published_sources(rows):
        series.append((f"{n} (published, H200)", [row_targets(r).get("published", {}).get(n) for r in rows],
                       PUBLISHED_STYLE))
    series.append((f"floor ({'copy' if cuda else 'host memcpy'} of the same bytes)", [r["floor_ms"] for r in rows],
                   "0.6"))
    fig, ax = plt.subplots(figsize=size)
    x, _, log = _bars(ax, labels, series, errs=errs)
    _goal_marks(ax, x, [row_targets(r).get("goal_ms") for r in rows], "goal (ms)")
    ax.set_ylabel("ms per call (median; flash-kda: min–max)" + (", log scale" if log else ""))
    _title(fig, "Prefill time per case", device, ax=ax)
    _legend_below(ax, ncol=min(3, len(series) + 1))
    p1 = _save(plt, fig, out_dir, "speed.png")

    series = [("flash-kda", [r["floor_ratio"] for r in rows], COLORS["flash-kda"])]
    for name, key in OTHERS:
        if any(f"{key}_ms" in r for r in rows):
            series.append((name if key != "fla" else "fla (Triton)", [r.get(f"{key}_floor_ratio") for r in rows],
                           COLORS[name]))
    fig, ax = plt.subplots(figsize=size)
    x, _, log = _bars(ax, labels, series)
    _goal_marks(ax, x, [row_targets(r).get("goal_ratio") for r in rows], "goal (floor ratio)")
    ax.axhline(1.0, color="0.5", linewidth=0.8)
    if not log:
        ax.set_ylim(0, ax.get_ylim()[1])
    ax.set_ylabel("time ÷ copy floor (lower is better)" + (", log scale" if log else ""))
    _title(fig, "Floor ratio per case" + ("" if cuda else " (floor: a host memcpy)"), device, ax=ax)
    _legend_below(ax, ncol=min(4, len(series) + 1))
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
        ax.axhline(limit, color="r", linestyle="--", linewidth=1, label=f"limit {limit:g} (docs/spec.md)")
        ax.set_yscale("log")
        ax.set_ylim(min(vals) / 3, max(vals) * 3)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=30, ha="right")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.set_title(f"{what}: rel. L2 error vs float64")
        ax.legend(fontsize=7)
    _title(fig, "Accuracy against float64", device)
    return [_save(plt, fig, out_dir, "accuracy.png")]


def _tokens(t):
    return f"{t / 1024:g}K" if t >= 1024 else str(t)


def _plot_e2e(plt, part, out_dir, device):
    rows = part["rows"]
    labels = [f"{r['config']}\n{'+MLP' if r['mlp'] else 'KDA only'}, {_tokens(r['tokens'])}" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(max(9, 2.0 * len(rows) + 3), 4.8))
    _bars(axes[0], labels, log=False, series=[("fla (Triton)", [1.0 for r in rows], "C1"),
                            ("flash-kda", [r["t_flash_kda_ms"] / r["t_fla_ms"] for r in rows], "C0"),
                            ("no-op KDA (the rest of the stack)", [r["t_noop_ms"] / r["t_fla_ms"] for r in rows], "0.6")])
    for i, r in enumerate(rows):
        axes[0].annotate(f"{r['t_fla_ms']:.1f} ms", (i, 1.0), ha="center", va="bottom", fontsize=6)
    axes[0].set_ylabel("stack time ÷ fla's stack time (median)")
    axes[0].set_title("Layer-stack prefill time (fla = 1)")
    _legend_below(axes[0], ncol=2, below=-0.14)
    _bars(axes[1], labels, log=False, series=[("kernel speedup s", [r["s"] for r in rows], "C2"),
                            ("Amdahl 1/(1-f+f/s)", [r["amdahl"] for r in rows], "C4"),
                            ("measured", [r["measured"] for r in rows], "C0")])
    axes[1].axhline(1.0, color="0.5", linewidth=0.8)
    axes[1].set_ylabel("speedup over fla (×)")
    axes[1].set_title("Speedup: kernel, predicted, measured")
    _legend_below(axes[1], ncol=3, below=-0.14)
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
        for lab in ax.get_xticklabels():
            lab.set_rotation(0)
            lab.set_ha("center")
    _title(fig, "End-to-end prefill", device)
    return [_save(plt, fig, out_dir, "e2e.png")]
