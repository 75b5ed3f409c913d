"""Accuracy against the float64 recurrence (flash_kda.reference) across input distributions.

For each case of cases.ACCURACY_CASES: fresh random inputs (docs/spec.md: normal q, k, v, g, beta, a
normal fp32 initial state; A_log, dt_bias uniform [0, 1)), transformed per case (large |v|, strong
or weak decay, many short sequences), rounded to bf16; the float64 reference runs on exactly those
values. Error = ||x - ref||_2 / ||ref||_2 for out and the fp32 final state, over every token and
sequence of the first 8 heads (heads are independent; the reference's time grows with them); every
element of every head must be written (the outputs are poisoned with NaN before the call).
Implementations: flash-kda on the backend at hand (CUDA, else the CPU backend "cpu") and, on CUDA
with fla importable, fla's Triton chunk_kda (FLA_FLASH_KDA=0). "bf16 floor" is the error of
rounding the reference's own out to bf16: no bf16 output can be much closer.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

import flash_kda

from . import cases as C
from .timing import Progress

SCALE, LOWER_BOUND = C.SCALE, C.LOWER_BOUND
LIMITS = dict(out=4e-3, state=3e-3, out_goal=3e-3, state_goal=2e-3)  # docs/spec.md, fp32 state


def _rel(x, ref):
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        return float("nan")
    norm = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / norm) if norm > 0 else float(np.linalg.norm(x))


def make_inputs(case, rng):
    """Host inputs (bf16/fp32 NumPy) of an accuracy case, and its batch description."""
    H, D = case["H"], C.K
    if "nseq" in case:
        lens = [int(n) for n in rng.integers(1, case["max_len"] + 1, case["nseq"])]
        B, T, N = 1, sum(lens), len(lens)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    else:
        lens, cu = None, None
        B, T, N = case["B"], case["T"], case["B"]
    f32 = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    raw = dict(q=f32(B, T, H, D), k=f32(B, T, H, D), v=f32(B, T, H, D), g=f32(B, T, H, D), beta=f32(B, T, H))
    transform = case.get("transform")
    if transform == "v*100":
        raw["v"] *= 100
    elif transform == "g+8":
        raw["g"] += 8
    elif transform == "g-7":
        raw["g"] -= 7
    elif transform is not None:
        raise ValueError(f"unknown transform {transform!r}")
    x = {n: a.astype(ml_dtypes.bfloat16) for n, a in raw.items()}
    x.update(A_log=rng.random(H, dtype=np.float32), dt_bias=rng.random((H, D), dtype=np.float32),
             h0=rng.standard_normal((N, H, D, D), dtype=np.float32), cu=cu)
    return x, dict(B=B, T=T, N=N, H=H, lens=lens)


def _reference(x, hc):
    """float64 out and final state of the first `hc` heads (heads are independent)."""
    acts = [x[n][:, :, :hc] for n in ("q", "k", "v", "g", "beta")]
    return flash_kda.reference(*acts, SCALE, x["A_log"][:hc], x["dt_bias"][:hc], LOWER_BOUND, x["h0"][:, :hc],
                               x["cu"])


def _run_host(x, backend):
    out = np.full(x["v"].shape, np.nan, dtype=ml_dtypes.bfloat16)  # poisoned: a missed write shows
    ht = np.full(x["h0"].shape, np.nan, dtype=np.float32)
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], SCALE, out, x["A_log"], x["dt_bias"], LOWER_BOUND,
                  x["h0"], ht, x["cu"], backend=backend)
    return out.astype(np.float64), ht.astype(np.float64)


def _to_cuda(torch, x):
    def move(a):
        if a is None:
            return None
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
        return torch.from_numpy(a).cuda()

    return {n: move(a) for n, a in x.items()}


def _run_cuda(torch, xc):
    out = torch.full_like(xc["v"], float("nan"))
    ht = torch.full_like(xc["h0"], float("nan"))
    flash_kda.fwd(xc["q"], xc["k"], xc["v"], xc["g"], xc["beta"], SCALE, out, xc["A_log"], xc["dt_bias"],
                  LOWER_BOUND, xc["h0"], ht, xc["cu"])
    torch.cuda.synchronize()
    return out.double().cpu().numpy(), ht.double().cpu().numpy()


def _run_fla(torch, chunk_kda, xc):
    from .speed import call_fla

    with torch.no_grad():
        o, s = call_fla(chunk_kda, dict(xc, dt_bias=xc["dt_bias"].reshape(-1)))
    torch.cuda.synchronize()
    return o.double().cpu().numpy(), s.double().cpu().numpy()


def run(case_names=None, device="cpu", seed=None, progress=True, use_fla=True, heads=None, check_heads=8,
        on_row=None):
    """Runs the accuracy suite on `device` ("cpu" or "cuda"); returns the rows. `heads` overrides
    every case's H (on CUDA the benchmark passes 32: the H of fixed32 and Kimi-Linear, so that fla
    autotunes no new H for it). Errors are measured on the first `check_heads` heads, which the
    float64 reference computes (heads are independent; the reference's time grows with them)."""
    suite = C.select(case_names or ["all"], C.ACCURACY_CASES)
    if heads:
        suite = [dict(c, H=heads) for c in suite]
    rng = np.random.default_rng(seed)
    torch = chunk_kda = None
    if device == "cuda":
        import torch

        from .speed import count_fwd_calls, fla_chunk_kda

        os.environ["FLA_FLASH_KDA"] = "0"
        chunk_kda = fla_chunk_kda() if use_fla else None
    rows = []
    with Progress(len(suite), f"accuracy ({device})", progress) as bar:
        for case in suite:
            bar.step(case["name"] + ": reference")
            x, shape = make_inputs(case, rng)
            hc = min(shape["H"], check_heads)
            ref_out, ref_state = _reference(x, hc)
            impls = {}

            def errors(out, st):  # every element must be written (NaN-poisoned), the first hc heads compared
                written = bool(np.all(np.isfinite(out)) and np.all(np.isfinite(st)))
                return dict(out_rel=_rel(out[:, :, :hc], ref_out) if written else float("nan"),
                            state_rel=_rel(st[:, :hc], ref_state) if written else float("nan"))

            if device == "cpu":
                bar.step(case["name"] + ": cpu")
                impls["flash-kda (cpu)"] = errors(*_run_host(x, "cpu"))
            else:
                xc = _to_cuda(torch, x)
                bar.step(case["name"] + ": flash-kda")
                impls["flash-kda"] = errors(*_run_cuda(torch, xc))
                if chunk_kda is not None:
                    bar.step(case["name"] + ": fla")
                    with count_fwd_calls() as dispatched:
                        impls["fla"] = errors(*_run_fla(torch, chunk_kda, xc))
                    if dispatched[0]:
                        impls["fla"]["error"] = "fla dispatched to flash_kda.fwd"
                del xc
            for r in impls.values():
                r["out_ok"] = r["out_rel"] <= LIMITS["out"]  # False for NaN too
                r["state_ok"] = r["state_rel"] <= LIMITS["state"]
            row = dict(case=case["name"], what=case["what"], **shape, heads_checked=hc, impls=impls,
                       bf16_out_floor=_rel(ref_out.astype(ml_dtypes.bfloat16), ref_out))
            rows.append(row)
            bar.write(f"{case['name']:<16s} " + "  ".join(
                f"{n}: out {r['out_rel']:.2e} state {r['state_rel']:.2e}" for n, r in impls.items())
                + f"  (bf16 floor {row['bf16_out_floor']:.2e})")
            if on_row:
                on_row(rows)
            bar.update()
    return rows
