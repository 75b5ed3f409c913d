"""Command line of `python -m flash_kda.bench` (see the package docstring)."""

from __future__ import annotations

import argparse
import os
import random
import sys

from . import cases as C
from . import report

PARTS = ("speed", "accuracy", "e2e")


def _device(requested):
    """'cuda' when this build's CUDA backend, an sm_90 GPU and torch with CUDA are present, else 'cpu'."""
    import flash_kda

    if requested == "cpu":
        return "cpu"
    ok = False
    if flash_kda.cuda_available():
        try:
            import torch

            ok = torch.cuda.is_available()
        except ImportError:
            ok = False
    if requested == "cuda" and not ok:
        sys.exit("flash_kda.bench: --device cuda needs a CUDA build of flash-kda, an sm_90 GPU and torch with CUDA")
    return "cuda" if ok else "cpu"


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m flash_kda.bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=("Benchmarks of flash-kda: prefill speed against the copy floor (and fla and FlashKDA "
                     "where importable), accuracy against float64, end-to-end fla layer stacks. Writes a "
                     "JSON of raw numbers, a markdown report and PNG plots into --out."),
        epilog=("parts: speed (default), accuracy, e2e (CUDA + fla only), all. Examples:\n"
                "  python -m flash_kda.bench                         # speed suite of this device\n"
                "  python -m flash_kda.bench --cases fixed96 fixed32 --fla none\n"
                "  python -m flash_kda.bench --cases serving --flashkda none\n"
                "  python -m flash_kda.bench --shape T=8192,H=48 --shape lens=1300+547+1024x2,H=64\n"
                "  python -m flash_kda.bench accuracy\n"
                "  python -m flash_kda.bench e2e --configs kimi-linear-softplus --tokens 8K 32K\n"
                "  python -m flash_kda.bench all --out results/\n"
                "  python -m flash_kda.bench report results/bench.json [more.json ...] --md REPORT.md "
                "--plots DIR"))
    p.add_argument("parts", nargs="*", metavar="PART", help="speed | accuracy | e2e | all (default: speed)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: CUDA when usable, else the CPU backend (default)")
    p.add_argument("--out", default="flash_kda_bench", help="output folder (default ./flash_kda_bench)")
    p.add_argument("--json", default=None, help="results JSON (default OUT/bench.json)")
    p.add_argument("--no-plots", action="store_true", help="write no PNGs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, recorded in the JSON)")
    s = p.add_argument_group("speed")
    s.add_argument("--cases", nargs="+", default=None, metavar="CASE",
                   help=("cases by name, or a group: 'all' (this device's suite), 'gpu' (the CUDA suite: "
                         "'prefill' and 'serving'), 'cpu' (the CPU suite). "
                         f"prefill: {', '.join(C.PREFILL_CASES)}. serving: {', '.join(C.SERVING_CASES)}. "
                         f"cpu: {', '.join(C.CPU_CASES)}"))
    s.add_argument("--shape", action="append", default=[], metavar="SPEC",
                   help=("a custom case, e.g. T=8192,H=48 or B=4,T=2048,H=32 or lens=1300+547+1024x2,H=64 "
                         "(name=NAME to name it); repeatable. Given alone, only these run"))
    s.add_argument("--reps", type=int, default=None, help="timed calls per measurement (default 30 CUDA, 5 CPU)")
    s.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 5 CUDA, 1 CPU)")
    s.add_argument("--fla", nargs="+", default=["auto"], metavar="CASE",
                   help="cases to time fla on: 'auto' (all when fla is importable, default), 'all', 'none', or names")
    s.add_argument("--fla-budget", type=float, default=None, metavar="SECONDS",
                   help="skip fla on a case with a new H (a new autotuning) once this many seconds have passed")
    s.add_argument("--flashkda", choices=["auto", "none"], default="auto",
                   help=("FlashKDA (MoonshotAI's CUTLASS library) on the same inputs: 'auto' times it on every "
                         "case when its extension module flash_kda_C is importable (default), 'none' does not"))
    a = p.add_argument_group("accuracy")
    a.add_argument("--acc-cases", nargs="+", default=None, metavar="CASE",
                   help=f"accuracy cases (default all): {', '.join(C.ACCURACY_CASES)}")
    a.add_argument("--acc-heads", type=int, default=None, metavar="H",
                   help=("heads of every accuracy case (default: 32 on CUDA, an H fla has autotuned for "
                         "already; the suite's 8 and 4 on the CPU)"))
    e = p.add_argument_group("e2e")
    from .e2e import CONFIGS

    e.add_argument("--configs", nargs="+", default=None, metavar="NAME",
                   help=(f"layer-stack configurations (default all): {', '.join(CONFIGS)}. The -softplus ones "
                         "use fla's unbounded softplus gate (Kimi-Linear-48B as trained), which fla does not "
                         "dispatch: flash-kda enters through flash_kda.chunk_kda in place of fla's chunk_kda"))
    e.add_argument("--tokens", nargs="+", type=_tokens, default=[8192, 32768], metavar="T",
                   help="prefill lengths in tokens, e.g. 8192 or 8K, 32K (= 32768) (default 8192 32768)")
    e.add_argument("--layers", type=int, default=None, help="layers per stack (default per config)")
    e.add_argument("--e2e-reps", type=int, default=7, help="timed forwards per variant (default 7)")
    e.add_argument("--mlp", choices=["both", "with", "without"], default="both",
                   help="stacks with the MLPs, without (KDA sublayers alone), or both (default)")
    return p


def _tokens(text):
    """--tokens: 8192, or 8K / 32K (x 1024)."""
    from .e2e import parse_tokens

    try:
        return parse_tokens(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _report_parser():
    p = argparse.ArgumentParser(
        prog="python -m flash_kda.bench report",
        description="Markdown report (and plots) from one or more results JSON files (merged: the rows of every file, a later row replacing an earlier one of the same case).")
    p.add_argument("files", nargs="+", help="results JSON files")
    p.add_argument("--md", default=None, help="write the markdown here (default: stdout)")
    p.add_argument("--plots", default=None, metavar="DIR", help="write the PNGs here (default: none)")
    p.add_argument("--images", default=None, metavar="PREFIX",
                   help="where the markdown links the PNGs (default: --plots relative to the markdown file)")
    p.add_argument("--json", default=None, help="also write the merged results here")
    p.add_argument("--title", default=None, help="a level-1 heading")
    p.add_argument("--preamble", default=None, metavar="FILE", help="markdown inserted after the title")
    return p


def main_report(argv):
    args = _report_parser().parse_args(argv)
    results = report.load(args.files)
    if args.json:
        report.write_json(results, args.json)
    pngs = []
    if args.plots:
        pngs = report.plot(results, args.plots)
        if not pngs and not report.have_matplotlib():
            print(report.MATPLOTLIB_MISSING, file=sys.stderr)
    prefix = args.images
    if prefix is None and args.plots:
        base = os.path.dirname(os.path.abspath(args.md)) if args.md else os.getcwd()
        prefix = os.path.relpath(os.path.abspath(args.plots), base)
    text = report.markdown(results, image_prefix=prefix, title=args.title)
    if args.preamble:
        with open(args.preamble) as f:
            pre = f.read().rstrip() + "\n\n"
        if args.title:
            head, _, rest = text.partition("\n")
            text = head + "\n\n" + pre + rest.lstrip("\n")
        else:
            text = pre + text
    written = ([args.json] if args.json else []) + pngs
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
        written.insert(0, args.md)
    else:
        sys.stdout.write(text)
    # on stderr: the markdown may be going to stdout
    print("flash_kda.bench report: " + (f"wrote {', '.join(written)}" if written else "wrote the markdown to stdout")
          + (" (no plots: matplotlib is not installed)" if args.plots and not pngs else ""), file=sys.stderr)
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        return main_report(argv[1:])
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    parts = args.parts or ["speed"]
    bad = [x for x in parts if x not in PARTS + ("all",)]
    if bad:
        parser.error(f"unknown part(s) {', '.join(bad)}: expected speed, accuracy, e2e, all or report")
    parts = list(PARTS) if "all" in parts else [x for x in PARTS if x in parts]
    for name in ("reps", "warmup", "e2e_reps", "layers", "acc_heads"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "warmup" else 1):
            parser.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'warmup' else 1}")
    if any(t < 65 for t in args.tokens):
        parser.error("--tokens must be > 64 (shorter prefills take fla's recurrent path)")

    if args.configs and args.configs != ["all"]:
        from .e2e import CONFIGS

        unknown = [c for c in args.configs if c not in CONFIGS]
        if unknown:
            parser.error(f"unknown e2e config(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")

    device = _device(args.device)
    if "e2e" in parts:
        from .e2e import unavailable

        why = "the CPU backend is in use (--device cpu)" if device == "cpu" and args.device == "cpu" else unavailable()
        if why:
            msg = f"flash_kda.bench: end-to-end needs CUDA, fla and flash-kda's CUDA build: {why}"
            if parts == ["e2e"]:  # nothing else asked for: a failure
                print(msg + ".", file=sys.stderr)
                return 2
            print(msg + "; skipping it.", file=sys.stderr)
            parts.remove("e2e")

    # ---- speed cases ----
    speed_cases = []
    if "speed" in parts:
        try:
            speed_cases = speed_cases_of(args.cases, args.shape, device)
        except ValueError as e:
            parser.error(str(e))
    if args.acc_cases:
        try:
            C.select(args.acc_cases, C.ACCURACY_CASES)
        except ValueError as e:
            parser.error(str(e))
    os.makedirs(args.out, exist_ok=True)
    json_path = args.json or os.path.join(args.out, "bench.json")
    meta = report.collect_meta(device, argv)
    if args.seed is None:  # fresh draws every run (docs/spec.md), recorded so that a run can be replayed
        args.seed = random.SystemRandom().randrange(2 ** 31)
    meta["seed"] = args.seed
    results = report.new_results(meta)
    progress = not args.no_progress
    if not args.no_plots and not report.have_matplotlib():
        print(f"flash_kda.bench: {report.MATPLOTLIB_MISSING}", file=sys.stderr)

    print(f"flash_kda.bench: {', '.join(parts)} on {meta['device']} (backend {device}); "
          f"commit {(meta.get('commit') or 'unknown')[:12]}; results in {args.out}", flush=True)

    def save(part, rows, **extra):
        results[part] = dict(meta=meta, rows=rows, **extra)
        report.write_json(results, json_path)

    status = 0
    if "speed" in parts:
        from . import speed

        if device == "cuda":
            fla_cases = _fla_cases(args.fla, speed_cases)
            if fla_cases and speed.fla_chunk_kda() is None:
                if args.fla not in (["auto"],):
                    print("flash_kda.bench: fla is not importable: fla not timed", file=sys.stderr)
                fla_cases = []
            if fla_cases:
                n_h = len({c["H"] for c in speed_cases if c["name"] in fla_cases})
                print(f"flash_kda.bench: fla's chunk_kda on {len(fla_cases)} case(s); it autotunes 1-2 minutes "
                      f"for each new H ({n_h} here); --fla none skips it", flush=True)
            fk, fk_info = _flashkda(args.flashkda)
            rows = speed.run_cuda(speed_cases, reps=args.reps or 30, warmup=5 if args.warmup is None else args.warmup,
                                  seed=args.seed, progress=progress, fla_cases=fla_cases,
                                  fla_budget_s=args.fla_budget, flashkda=fk,
                                  on_row=lambda r: save("speed", r, flashkda=fk_info))
            speed_extra = dict(flashkda=fk_info)
        else:
            if args.fla not in (["auto"], ["none"]):
                print("flash_kda.bench: fla needs CUDA: not timed on the CPU backend", file=sys.stderr)
            rows = speed.run_cpu(speed_cases, reps=args.reps or 5, warmup=1 if args.warmup is None else args.warmup,
                                 seed=args.seed, progress=progress, on_row=lambda r: save("speed", r))
            speed_extra = {}
        save("speed", rows, **speed_extra)
        if any("fla_error" in r for r in rows):
            status = 1
    if "accuracy" in parts:
        from . import accuracy

        rows = accuracy.run(args.acc_cases, device=device, seed=args.seed, progress=progress,
                            use_fla=args.fla != ["none"], on_row=lambda r: save("accuracy", r),
                            heads=args.acc_heads or (32 if device == "cuda" else None))
        save("accuracy", rows, limits=accuracy.LIMITS)
        if not all(m["out_ok"] and m["state_ok"] for r in rows for n, m in r["impls"].items() if n != "fla"):
            print("flash_kda.bench: flash-kda is above the error limits of docs/spec.md on some case", file=sys.stderr)
            status = 1
    if "e2e" in parts:
        from . import e2e

        mlp = ("with", "without") if args.mlp == "both" else (args.mlp,)
        rows = e2e.run(args.configs, tokens=args.tokens, layers=args.layers, reps=args.e2e_reps, mlp=mlp,
                       seed=args.seed, progress=progress, on_row=lambda r: save("e2e", r))
        save("e2e", rows)
        if not all(r["dispatch_ok"] for r in rows):
            print("flash_kda.bench: fla did not dispatch to flash-kda as expected (see the dispatch column)",
                  file=sys.stderr)
            status = 1

    md_path = os.path.join(args.out, "bench.md")
    pngs = []
    if not args.no_plots:
        pngs = report.plot(results, args.out)
    text = report.markdown(results, image_prefix="." if pngs else None, title="flash-kda benchmark")
    with open(md_path, "w") as f:
        f.write(text)
    summary = report.md_summary({k: results[k] for k in PARTS if k in results})
    if summary:
        print("\n" + summary)
    print(f"flash_kda.bench: wrote {json_path}, {md_path} (the tables)" + "".join(f", {p}" for p in pngs)
          + ("" if pngs or args.no_plots else " (no plots: matplotlib is not installed)"))
    return status


def _flashkda(mode):
    """(FlashKDA's extension module or None, what the results record about it), with a line saying
    whether it is timed."""
    if mode == "none":
        return None, dict(timed=False, why="--flashkda none")
    from . import flashkda

    fk, why = flashkda.load()
    if fk is None:
        print(f"flash_kda.bench: FlashKDA not timed: its extension module {flashkda.MODULE} is not importable "
              f"({why}); put the folder holding it on PYTHONPATH to time it beside flash-kda", flush=True)
        return None, dict(timed=False, why=why)
    path = getattr(fk, "__file__", None)
    print(f"flash_kda.bench: FlashKDA ({flashkda.MODULE}, {path}) timed on every case; --flashkda none skips it",
          flush=True)
    return fk, dict(timed=True, module=path)


def speed_cases_of(names, shapes, device):
    """The speed cases of --cases NAMES (names or groups of cases.py; None: this device's suite, or
    none when --shape gives custom cases) followed by those of --shape SHAPES."""
    custom = [C.parse_shape(s) for s in shapes]
    if names is None:
        names = [] if custom else ["all"]
    known = {**C.GPU_CASES, **C.CPU_CASES}
    chosen = []
    for n in names:
        if n == "all":
            chosen += C.select(["all"], C.GPU_CASES if device == "cuda" else C.CPU_CASES)
        elif n in C.GROUPS:
            chosen += C.select(["all"], C.GROUPS[n])
        else:
            chosen += C.select([n], known)
    return chosen + custom


def _fla_cases(spec, cases):
    names = [c["name"] for c in cases]
    if spec in (["auto"], ["all"]):
        return names
    if spec == ["none"]:
        return []
    return [n for n in names if n in spec]
