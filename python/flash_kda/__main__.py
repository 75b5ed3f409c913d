"""python -m flash_kda: time the forward on the best backend present and check it against float64.

Runs one problem (default B=1, T=8192, H=8, K=V=128, fp32 states, lower_bound=-5, scale=K**-0.5) on
CUDA when this build has the kernels, an sm_90 GPU is present and torch is importable, else on the
multi-threaded CPU path. Prints the median time, the throughput, and the relative L2 error of out and
final_state against the float64 NumPy recurrence on a slice of the problem (first sequence, first
512 tokens, first 2 heads): the slice is run through the same backend and the reference, so both see
exactly the same inputs. Exits 1 if an error is above docs/spec.md's limits (out 4e-3, fp32 state 3e-3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import ml_dtypes
import numpy as np

import flash_kda

OUT_LIMIT, STATE_LIMIT = 4e-3, 3e-3


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m flash_kda", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1, help="B (default 1)")
    p.add_argument("--seqlen", type=int, default=8192, help="T, tokens per batch row (default 8192)")
    p.add_argument("--heads", type=int, default=8, help="H = HV (default 8)")
    p.add_argument("--head-dim", type=int, default=128, help="K = V (default 128; CUDA runs 128 or 64)")
    p.add_argument("--backend", choices=["auto", "cuda", "cpu", "reference"], default="auto",
                   help="auto: CUDA if usable, else cpu (default)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs (default 5 on the host, 50 on CUDA)")
    p.add_argument("--check-tokens", type=int, default=512, help="tokens of the error slice")
    p.add_argument("--check-heads", type=int, default=2, help="heads of the error slice")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    args = p.parse_args(argv)
    for name in ("batch", "seqlen", "heads", "head_dim", "repeat", "check_tokens", "check_heads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def _pick_backend(requested):
    """(backend name, torch module or None). torch is imported only when CUDA can be used."""
    if requested in ("cpu", "reference"):
        return requested, None
    if flash_kda.cuda_available():
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():
            return "cuda", torch
    if requested == "cuda":
        sys.exit("python -m flash_kda: --backend cuda needs a CUDA build of flash-kda, an sm_90 GPU "
                 "and torch with CUDA")
    return "cpu", None


def _inputs(rng, B, T, H, D):
    """Fresh random inputs as NumPy arrays (docs/spec.md: normal q, k, v, g, beta; uniform A_log, dt_bias)."""
    bf16 = ml_dtypes.bfloat16
    normal = lambda *shape: rng.standard_normal(shape, dtype=np.float32).astype(bf16)  # noqa: E731
    return dict(
        q=normal(B, T, H, D), k=normal(B, T, H, D), v=normal(B, T, H, D), g=normal(B, T, H, D),
        beta=normal(B, T, H),
        A_log=rng.random(H, dtype=np.float32), dt_bias=rng.random((H, D), dtype=np.float32),
        initial_state=rng.standard_normal((B, H, D, D), dtype=np.float32),
    )


def _to_torch(torch, arrays):
    def move(a):
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
        return torch.from_numpy(a).cuda()

    return {name: move(a) for name, a in arrays.items()}


class _Runner:
    """Runs fwd on one backend with freshly allocated outputs; `sync` waits for the device."""

    def __init__(self, backend, torch):
        self.backend, self.torch = backend, torch

    def empty(self, like, shape, dtype):
        if self.torch is None:
            return np.empty(shape, dtype=dtype)
        tdtype = self.torch.bfloat16 if dtype == ml_dtypes.bfloat16 else self.torch.float32
        return self.torch.empty(shape, dtype=tdtype, device=like.device)

    def run(self, x, scale, lower_bound, out, final_state):
        flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], scale, out, x["A_log"],
                      x["dt_bias"], lower_bound, x["initial_state"], final_state,
                      backend=None if self.backend == "cuda" else self.backend)

    def sync(self):
        if self.torch is not None:
            self.torch.cuda.synchronize()

    def numpy(self, a):
        if self.torch is None:
            return a.astype(np.float64)
        return a.detach().to("cpu", self.torch.float64).numpy()


def _rel(x, ref):
    norm = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / norm) if norm > 0 else float(np.linalg.norm(x))


def main(argv=None):
    args = _parse(argv)
    B, T, H, D = args.batch, args.seqlen, args.heads, args.head_dim
    scale, lower_bound = D ** -0.5, -5.0
    backend, torch = _pick_backend(args.backend)
    repeat = args.repeat or (50 if backend == "cuda" else 5)
    rng = np.random.default_rng(args.seed)
    host = _inputs(rng, B, T, H, D)
    x = host if torch is None else _to_torch(torch, host)
    runner = _Runner(backend, torch)
    out = runner.empty(x["q"], (B, T, H, D), ml_dtypes.bfloat16)
    final_state = runner.empty(x["q"], (B, H, D, D), np.float32)

    if backend == "cuda":
        name = f"cuda ({torch.cuda.get_device_name()})"
    elif backend == "cpu":
        name = f"cpu (fp32 chunked, {os.cpu_count()} hardware threads)"
    else:
        name = "reference (float64 per-token recurrence, host)"
    print(f"flash-kda {flash_kda.__version__} | backend: {name}")
    print(f"problem: B={B} T={T} H=HV={H} K=V={D}, fp32 states, lower_bound={lower_bound}, "
          f"scale={scale:.4g}")

    # ---- timing ----
    for _ in range(3 if backend == "cuda" else 1):  # warm-up (threads, caches, module load)
        runner.run(x, scale, lower_bound, out, final_state)
    runner.sync()
    times = []
    for _ in range(repeat):
        if torch is not None:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runner.run(x, scale, lower_bound, out, final_state)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
        else:
            t0 = time.perf_counter()
            runner.run(x, scale, lower_bound, out, final_state)
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    print(f"time: median {median * 1e3:.3f} ms over {repeat} runs (min {min(times) * 1e3:.3f} ms)")
    print(f"throughput: {B * T / median:,.0f} tokens/s ({B * T * H / median:,.0f} token-heads/s)")

    # ---- error on a slice: the same inputs through the backend and the float64 reference ----
    Tc, Hc = min(T, args.check_tokens), min(H, args.check_heads)
    acts = ("q", "k", "v", "g", "beta")
    part = {n: x[n][:1, :Tc, :Hc] for n in acts}
    part.update(A_log=x["A_log"][:Hc], dt_bias=x["dt_bias"][:Hc],
                initial_state=x["initial_state"][:1, :Hc])
    part_out = runner.empty(x["q"], (1, Tc, Hc, D), ml_dtypes.bfloat16)
    part_state = runner.empty(x["q"], (1, Hc, D, D), np.float32)
    if torch is None:  # fresh NumPy buffers hold garbage; make a missed write visible
        part_out.fill(np.nan)
        part_state.fill(np.nan)
    else:
        part_out.fill_(float("nan"))
        part_state.fill_(float("nan"))
    runner.run(part, scale, lower_bound, part_out, part_state)
    runner.sync()
    ref_host = {n: host[n][:1, :Tc, :Hc] for n in acts}
    ref_out, ref_state = flash_kda.reference(
        *(ref_host[n] for n in acts), scale, host["A_log"][:Hc], host["dt_bias"][:Hc], lower_bound,
        host["initial_state"][:1, :Hc])
    out_err = _rel(runner.numpy(part_out), ref_out)
    state_err = _rel(runner.numpy(part_state), ref_state)
    ok = out_err <= OUT_LIMIT and state_err <= STATE_LIMIT  # False for NaN too
    print(f"error vs float64 reference (sequence 0, tokens 0..{Tc - 1}, heads 0..{Hc - 1}): "
          f"out rel {out_err:.3e}, final_state rel {state_err:.3e} "
          f"[{'ok' if ok else 'FAIL'}: limits {OUT_LIMIT:g} / {STATE_LIMIT:g}]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
