"""Host overhead of one flash-kda call from Python: microseconds per eager call on a tiny problem.

    python bench/host_overhead.py [--device cuda|cpu] [--calls 2000] [--repeats 15] [--json FILE]
                                  [--dry]

Problem: B=1, T=16, H=HV=4, K=V=128, fp32 initial and final state, lower_bound=-5 (the kernel
itself takes a few microseconds on an H200, so the time per call is the host path: argument
handling, checks, the launch). Each route is timed as N back-to-back calls followed by one
synchronisation, so the device work overlaps the host work and the figure is host time per call;
the median over --repeats such runs is reported (with min and max). The routes take turns in every
repeat, and each run is also given as a multiple of the torch_add run of the same round (the
host's drift cancels in that ratio).

Routes:
  fwd              flash_kda.fwd(q, ..., out, ..., initial_state, final_state): FlashKDA's call
  fwd_varlen       the same with cu_seqlens (2 sequences) and cu_seqlens_cpu (no host copy)
  fwd_varlen_sync  cu_seqlens on the device without a host copy: fwd copies it to check it (a sync)
  chunk_kda        flash_kda.chunk_kda(...): allocates out and final_state
  op_fwd           torch.ops.flash_kda.fwd(...): the custom operator through torch's dispatcher
  op_chunk_kda     torch.ops.flash_kda.chunk_kda(...)
  decode           flash_kda.decode(...): one token for each of 4 sequences on a pool of 8 fp32
                   slots (the per-step call of a serving engine)
  op_decode        torch.ops.flash_kda.decode(...)
  torch_add        x.add_(1) on a 16-element tensor: torch's own per-op cost, for scale

Every route is one call into flash_kda._C, which converts the arrays and checks every argument in
C++ (src/api). --dry (CPU only): _C.fwd runs with run=False, which converts and validates the
arguments but computes nothing, so the figures are the Python, binding and checking layers
without the CPU backend's compute. The decode routes are not stubbed: on the CPU they include the
decode's compute.
"""

import argparse
import json
import platform
import statistics
import sys
import time

import torch

import flash_kda
import flash_kda.torch_ops  # noqa: F401  (registers torch.ops.flash_kda)
from flash_kda import _C

B, T, H, K = 1, 16, 4, 128


def make(device):
    gen = torch.Generator(device="cpu").manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=torch.bfloat16)  # noqa: E731
    x = dict(q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, H, K), g=rnd(B, T, H, K),
             beta=rnd(B, T, H),
             A_log=torch.rand(H, generator=gen).to(device),
             dt_bias=torch.rand(H * K, generator=gen).to(device),
             h0=torch.randn(B, H, K, K, generator=gen).to(device))
    x["out"] = torch.empty_like(x["v"])
    x["ht"] = torch.empty_like(x["h0"])
    x["cu"] = torch.tensor([0, 5, T], dtype=torch.int64, device=device)
    x["cu_cpu"] = x["cu"].cpu()
    x["h0_2"] = torch.randn(2, H, K, K, generator=gen).to(device)
    x["ht_2"] = torch.empty_like(x["h0_2"])
    # decode: N=4 sequences of one token, a pool of 8 slots
    x["dec"] = dict(q=rnd(4, 1, H, K), k=rnd(4, 1, H, K), v=rnd(4, 1, H, K), g=rnd(4, 1, H, K),
                    beta=rnd(4, 1, H), pool=torch.randn(8, H, K, K, generator=gen).to(device),
                    idx=torch.tensor([5, 0, 7, 2], dtype=torch.int32, device=device))
    x["dec"]["out"] = torch.empty_like(x["dec"]["v"])
    return x


def routes(x):
    q, k, v, g, beta, A, dt = (x[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias"))
    out, h0, ht, cu, cu_cpu, h02, ht2 = (x[n] for n in ("out", "h0", "ht", "cu", "cu_cpu", "h0_2", "ht_2"))
    scale, lb = K ** -0.5, -5.0
    ops = torch.ops.flash_kda
    small = torch.zeros(16, device=q.device)
    d = x["dec"]
    dec_args = (d["q"], d["k"], d["v"], d["g"], d["beta"], scale, d["out"], A, dt, lb, d["pool"], d["idx"])
    return {
        "fwd": lambda: flash_kda.fwd(q, k, v, g, beta, scale, out, A, dt, lb, h0, ht),
        "fwd_varlen": lambda: flash_kda.fwd(q, k, v, g, beta, scale, out, A, dt, lb, h02, ht2, cu,
                                            cu_seqlens_cpu=cu_cpu),
        "fwd_varlen_sync": lambda: flash_kda.fwd(q, k, v, g, beta, scale, out, A, dt, lb, h02, ht2, cu),
        "chunk_kda": lambda: flash_kda.chunk_kda(q, k, v, g, beta, scale, h0, True, lower_bound=lb,
                                                 A_log=A, dt_bias=dt),
        "op_fwd": lambda: ops.fwd(q, k, v, g, beta, scale, out, A, dt, lb, h0, ht),
        "op_chunk_kda": lambda: ops.chunk_kda(q, k, v, g, beta, scale, A, dt, lb, h0, None, None, True),
        "decode": lambda: flash_kda.decode(*dec_args),
        "op_decode": lambda: ops.decode(*dec_args),
        "torch_add": lambda: small.add_(1),
    }


def time_routes(table, names, sync, calls, repeats):
    """Per route, the microseconds per call of each timed run. The routes take turns within every
    repeat (route 1, 2, ..., then again), so that a slow stretch of the host -- a shared machine
    drifts by tens of per cent over a minute -- lands on all of them alike, not on whichever route
    it happened to overlap; each run is also expressed as a ratio to the torch_add run of its round."""
    for name in names:  # warm-up: caches, lazy initialisation
        for _ in range(max(calls // 10, 20)):
            table[name]()
    sync()
    per_call = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            fn = table[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            per_call[name].append((time.perf_counter() - t0) / calls * 1e6)
    return per_call


def dry_run():
    """Make the compiled forward convert and validate its arguments but compute nothing (CPU only)."""
    real = _C.fwd

    def stub(*args, **kwargs):
        return real(*args, **kwargs, run=False)

    _C.fwd = stub
    return real


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=None,
                    help="back-to-back calls per timed run (default 2000; 100 on the CPU unless --dry)")
    ap.add_argument("--repeats", type=int, default=15, help="timed runs (median reported)")
    ap.add_argument("--routes", nargs="*", default=None, help="subset of routes")
    ap.add_argument("--dry", action="store_true", help="CPU: time the host layers only (see above)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.dry:
        if device.type != "cpu":
            sys.exit("--dry is for --device cpu")
        dry_run()
    if args.calls is None:
        args.calls = 2000 if device.type == "cuda" or args.dry else 100
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = make(device)
    table = routes(x)
    names = args.routes or list(table)
    if device.type == "cpu" and not args.dry:
        names = [n for n in names if n != "fwd_varlen_sync"]  # identical to fwd_varlen on the host
    rows = []
    with torch.inference_mode():
        runs = time_routes(table, names, sync, args.calls, args.repeats)
    base = runs.get("torch_add")
    for name in names:
        ts = runs[name]
        row = dict(route=name, us_median=statistics.median(ts), us_min=min(ts), us_max=max(ts))
        if base is not None:  # this route's run over torch_add's in the same round
            row["vs_torch_add_median"] = statistics.median(t / b for t, b in zip(ts, base))
        rows.append(row)
    env = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
               or platform.machine(),
               torch=torch.__version__, python=platform.python_version(), flash_kda=flash_kda.__version__,
               problem=dict(B=B, T=T, H=H, K=K, state="fp32"), calls=args.calls, repeats=args.repeats,
               dry=args.dry)
    print(f"host overhead per call, {env['device']}, torch {env['torch']}, B={B} T={T} H={H} K=V={K}"
          f"{' (dry: no compute)' if args.dry else ''}; {args.calls} calls x {args.repeats} runs")
    print(f"{'route':<18}{'median us':>11}{'min us':>10}{'max us':>10}{'x torch_add':>13}")
    for r in rows:
        ratio = f"{r['vs_torch_add_median']:>13.2f}" if "vs_torch_add_median" in r else ""
        print(f"{r['route']:<18}{r['us_median']:>11.2f}{r['us_min']:>10.2f}{r['us_max']:>10.2f}{ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(env=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
