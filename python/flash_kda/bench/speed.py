"""The prefill speed suite.

For every case, in one process and on the same inputs:
  * flash-kda: on CUDA our call is captured once in a CUDA graph and replayed (the Python layer's
    checks, e.g. the host copy of cu_seqlens, stay out of the kernel time); CUDA events around
    each replay, warm-up, median of ``reps``. On the CPU backend: time.perf_counter around each call.
  * the floor: a copy moving the same bytes (q, k, v, g, beta, out once each plus the fp32
    initial and final state: cases.nbytes), device-to-device on CUDA (torch ``copy_`` of bytes/2
    onto bytes/2), a host memcpy (``numpy.copyto``) on the CPU; measured in the same run.
  * fla (CUDA, when importable): flash-linear-attention's Triton ``chunk_kda`` with
    FLA_FLASH_KDA=0 (so it does not dispatch to flash-kda), called eagerly as users call it,
    safe gate, lower_bound -5, fp32 state. Its first call for a new H autotunes (1-2 minutes).
  * FlashKDA (CUDA, when its extension ``flash_kda_C`` is importable: flash_kda.bench.flashkda):
    the same inputs and fp32 states, its own outputs and workspace, replayed from a CUDA graph as
    ours is (eager calls where its call cannot be captured; the row says which).

Floor ratio = median / copy median (lower is better, 1.0 is the memory-bandwidth floor); every
other implementation's median is also given over ours (``fla_over_ours``, ``flashkda_over_ours``).
"""

from __future__ import annotations

import contextlib
import os
import time

import ml_dtypes
import numpy as np

import flash_kda

from . import cases as C
from .timing import Progress, summarize, time_cuda, time_host

SCALE, LOWER_BOUND = C.SCALE, C.LOWER_BOUND


@contextlib.contextmanager
def count_fwd_calls():
    """Counts calls of flash_kda.fwd made through the module attribute (as fla's FlashKDA backend
    calls it) while the context is open; yields a one-element list holding the count."""
    counter = [0]
    original = flash_kda.fwd

    def counting(*args, **kwargs):
        counter[0] += 1
        return original(*args, **kwargs)

    flash_kda.fwd = counting
    try:
        yield counter
    finally:
        flash_kda.fwd = original


# ---------------------------------------------------------------------------------------------
# CPU backend (NumPy arrays)


def _cpu_inputs(case, rng):
    B, T, N, cu = C.expand(case)
    H, D = case["H"], C.K
    bf16 = ml_dtypes.bfloat16
    normal = lambda *s: rng.standard_normal(s, dtype=np.float32).astype(bf16)  # noqa: E731
    x = dict(q=normal(B, T, H, D), k=normal(B, T, H, D), v=normal(B, T, H, D), g=normal(B, T, H, D),
             beta=normal(B, T, H), A_log=rng.random(H, dtype=np.float32),
             dt_bias=rng.random((H, D), dtype=np.float32),
             h0=rng.standard_normal((N, H, D, D), dtype=np.float32),
             cu=None if cu is None else np.asarray(cu, dtype=np.int64))
    x["out"] = np.empty_like(x["v"])
    x["ht"] = np.empty_like(x["h0"])
    return x


def run_cpu(cases, reps=5, warmup=1, seed=None, progress=True, backend="cpu", on_row=None):
    """Times the CPU backend on each case; returns the rows."""
    rng = np.random.default_rng(seed)
    rows = []
    with Progress(len(cases), "speed (cpu)", progress) as bar:
        for case in cases:
            bar.step(case["name"])
            rows.append(_case_cpu(case, rng, reps, warmup, backend))
            bar.write(_line(rows[-1]))
            if on_row:
                on_row(rows)
            bar.update()
    return rows


def _case_cpu(case, rng, reps, warmup, backend):
    x = _cpu_inputs(case, rng)
    nb = C.nbytes(case)
    src = np.ones(nb // 2, dtype=np.uint8)
    dst = np.empty_like(src)

    def ours():
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], SCALE, x["out"], x["A_log"], x["dt_bias"],
                      LOWER_BOUND, x["h0"], x["ht"], x["cu"], backend=backend)

    t_ours = time_host(ours, reps, warmup)
    t_copy = time_host(lambda: np.copyto(dst, src), max(reps, 5), warmup)
    return _row(case, nb, {"flash-kda": summarize(t_ours)}, summarize(t_copy))


# ---------------------------------------------------------------------------------------------
# CUDA (torch tensors)


def _cuda_inputs(torch, case, gen, dev="cuda"):
    """Fresh random torch inputs of a case on `dev` (the tests build them on the CPU)."""
    B, T, N, cu = C.expand(case)
    H, D = case["H"], C.K
    rnd = lambda *s: torch.randn(*s, generator=gen, device=dev).to(torch.bfloat16)  # noqa: E731
    x = dict(q=rnd(B, T, H, D), k=rnd(B, T, H, D), v=rnd(B, T, H, D), g=rnd(B, T, H, D), beta=rnd(B, T, H),
             A_log=torch.rand(H, generator=gen, device=dev),
             dt_bias=torch.rand(H * D, generator=gen, device=dev),
             h0=torch.randn(N, H, D, D, generator=gen, device=dev),
             cu=None if cu is None else torch.tensor(cu, dtype=torch.int64, device=dev))
    x["out"] = torch.empty_like(x["v"])
    x["ht"] = torch.empty_like(x["h0"])
    return x


def fla_chunk_kda():
    """fla's chunk_kda, or None when fla is not importable."""
    try:
        from fla.ops.kda import chunk_kda
    except Exception:  # ImportError, or fla failing on this torch/triton
        return None
    return chunk_kda


def call_fla(chunk_kda, x):
    """fla's Triton chunk_kda on our inputs (safe gate, lower_bound -5, fp32 state, V-first)."""
    return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=SCALE, initial_state=x["h0"],
                     output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                     use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=LOWER_BOUND,
                     state_v_first=True, A_log=x["A_log"], dt_bias=x["dt_bias"], cu_seqlens=x["cu"])


def run_cuda(cases, reps=30, warmup=5, seed=None, progress=True, fla_cases=(), fla_budget_s=None,
             flashkda=None, on_row=None):
    """Times flash-kda (CUDA graph replay), the copy floor, fla and FlashKDA on each case; returns
    the rows.

    fla runs on the cases named in `fla_cases`; with `fla_budget_s`, a case whose H fla has not
    seen yet (a new autotuning) is skipped once that many seconds have passed in this suite.
    `flashkda`: FlashKDA's extension module (flash_kda.bench.flashkda.load), timed on every case,
    or None."""
    import torch

    os.environ["FLA_FLASH_KDA"] = "0"  # fla times its own Triton path, not a dispatch to us
    chunk_kda = fla_chunk_kda() if fla_cases else None
    gen = torch.Generator(device="cuda")
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    t_start = time.perf_counter()
    fla_seen_h = set()
    rows = []
    with Progress(len(cases), "speed (cuda)", progress) as bar:
        for case in cases:
            bar.step(case["name"])
            fla = None
            if chunk_kda is not None and case["name"] in fla_cases:
                fla = chunk_kda
                if (case["H"] not in fla_seen_h and fla_budget_s is not None
                        and time.perf_counter() - t_start > fla_budget_s):
                    fla = f"time budget ({fla_budget_s:.0f} s) spent before a new H"
            rows.append(_case_cuda(torch, case, gen, reps, warmup, fla, case["H"] in fla_seen_h, flashkda, bar))
            if "fla" in rows[-1]["impls"]:
                fla_seen_h.add(case["H"])
            bar.write(_line(rows[-1]))
            if on_row:
                on_row(rows)
            bar.update()
            torch.cuda.empty_cache()
    return rows


def _capture(torch, fn):
    """A CUDA graph of one call of fn (after a synchronisation; fn has been called eagerly once)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def _case_cuda(torch, case, gen, reps, warmup, fla, fla_tuned, fk, bar):
    """One case: flash-kda from a CUDA graph, the copy floor, fla (a chunk_kda, or the reason it is
    skipped, or None) and FlashKDA (its extension module, or None)."""
    x = _cuda_inputs(torch, case, gen)
    nb = C.nbytes(case)
    src = torch.empty(nb // 2, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)

    def ours():
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], SCALE, x["out"], x["A_log"], x["dt_bias"],
                      LOWER_BOUND, x["h0"], x["ht"], x["cu"])

    ours()  # eager first call: every argument check (cu_seqlens contents too)
    graph = _capture(torch, ours)
    impls = {"flash-kda": summarize(time_cuda(torch, graph.replay, reps, warmup))}
    t_copy = time_cuda(torch, lambda: dst.copy_(src), reps, warmup)
    extra = {}
    others = {}  # key -> (out, final state) of another implementation, compared with ours below
    if isinstance(fla, str):
        extra["fla_skipped"] = fla
    elif fla is not None:
        bar.step(f"{case['name']}: fla" + ("" if fla_tuned else " (autotuning)"))

        def fla_call():
            with torch.no_grad():
                return call_fla(fla, x)

        with count_fwd_calls() as dispatched:
            impls["fla"] = summarize(time_cuda(torch, fla_call, reps, warmup=3))
            others["fla"] = fla_call()
        if dispatched[0]:
            extra["fla_error"] = f"fla dispatched {dispatched[0]} calls to flash_kda.fwd"
    if fk is not None:
        bar.step(f"{case['name']}: FlashKDA")
        fk_result = _time_flashkda(torch, fk, x, case, reps, warmup)
        if "summary" in fk_result:
            impls["FlashKDA"] = fk_result.pop("summary")
            others["flashkda"] = fk_result.pop("outputs")
        extra.update(fk_result)
    if others:
        graph.replay()  # our out and final state on the same inputs
        torch.cuda.synchronize()
        for key, (o, s) in others.items():
            for what, ours_t, theirs in (("out", x["out"], o), ("state", x["ht"], s)):
                ref = theirs.float()
                extra[f"ours_vs_{key}_{what}_rel"] = float((ours_t.float() - ref).norm() / ref.norm())
    return _row(case, nb, impls, summarize(t_copy), device="cuda", **extra)


def _time_flashkda(torch, fk, x, case, reps, warmup):
    """FlashKDA on the case's inputs: {"summary": its times, "outputs": (out, final state),
    "flashkda_timing": how it was timed}, or {"flashkda_skipped": why} when it rejects the call.
    Like ours it is replayed from a CUDA graph (the host side of the call stays out of the time);
    where its call cannot be captured, its eager calls are timed, and the row says so."""
    from . import flashkda

    try:
        call, out, final_state = flashkda.make_call(fk, torch, x, case)
        call()  # eager first call: FlashKDA's own argument checks
        torch.cuda.synchronize()
    except RuntimeError as e:  # its checks raise RuntimeError (TORCH_CHECK)
        return {"flashkda_skipped": f"FlashKDA rejected the call: {_first_line(e, 200)}"}
    timed, how = call, "CUDA graph replay"
    try:
        timed = _capture(torch, call).replay
    except RuntimeError as e:
        torch.cuda.synchronize()
        how = f"eager calls (its CUDA graph capture failed: {_first_line(e, 120)})"
    summary = summarize(time_cuda(torch, timed, reps, warmup))
    timed()
    torch.cuda.synchronize()
    return {"summary": summary, "outputs": (out, final_state), "flashkda_timing": how}


def _first_line(error, limit):
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:limit]


# ---------------------------------------------------------------------------------------------


def _row(case, nb, impls, copy, device="cpu", **extra):
    """One case's row of the results: shape, bytes, every implementation's times, the floor and,
    per implementation, its median, floor ratio and time over flash-kda's (`fla_over_ours`,
    `flashkda_over_ours`); on CUDA the suite's goal and published times for the case (`targets`)."""
    B, T, N, _ = C.expand(case)
    row = dict(case=case["name"], batch=C.describe(case), lens=case.get("lens"), B=B, T=T, N=N, H=case["H"],
               bytes=nb, floor=copy, impls=impls)
    ours = impls["flash-kda"]["median_ms"]
    row["floor_ms"] = copy["median_ms"]
    row["ours_ms"] = ours
    row["floor_ratio"] = ours / copy["median_ms"]
    for name, key in (("fla", "fla"), ("FlashKDA", "flashkda")):
        if name in impls:
            row[f"{key}_ms"] = impls[name]["median_ms"]
            row[f"{key}_floor_ratio"] = row[f"{key}_ms"] / copy["median_ms"]
            row[f"{key}_over_ours"] = row[f"{key}_ms"] / ours
    targets = C.targets(case) if device == "cuda" else {}
    if targets:
        row["targets"] = targets
    row.update(extra)
    return row


def _line(row):
    text = (f"{row['case']:<14s} flash-kda {row['ours_ms']:8.3f} ms  floor {row['floor_ms']:7.3f} ms  "
            f"ratio {row['floor_ratio']:6.2f}")
    for key, name in (("fla", "fla"), ("flashkda", "FlashKDA")):
        if f"{key}_ms" in row:
            text += f"  {name} {row[f'{key}_ms']:8.3f} ms ({row[f'{key}_over_ours']:.2f}x)"
        elif f"{key}_skipped" in row:
            text += f"  {name} skipped: {row[f'{key}_skipped']}"
    return text
