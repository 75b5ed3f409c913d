"""Prefill benchmark of flash_kda.fwd on BENCH.md's cases (H200 protocol).

For every case, in one process: our kernel, a device-to-device copy of the same bytes (the floor),
and optionally fla's Triton chunk_kda on the same inputs. CUDA events, warm-up, median of --reps.
Bytes follow BENCH.md: q, k, v, g, beta, out once each plus the fp32 initial and final state.

    python bench/bench_fwd.py [--cases fixed96 fixed32 ...] [--fla fixed96 fixed32 | --fla all]
                              [--reps 30] [--json out.json]
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

import torch

CASES = {
    "fixed96": dict(lens=None, B=1, T=8192, H=96),
    "varlen6_96": dict(lens=[1300, 547, 2048, 963, 271, 3063], H=96),
    "v1024x8_96": dict(lens=[1024] * 8, H=96),
    "fixed64": dict(lens=None, B=1, T=8192, H=64),
    "varlen6_64": dict(lens=[1300, 547, 2048, 963, 271, 3063], H=64),
    "v1024x8_64": dict(lens=[1024] * 8, H=64),
    "fixed32": dict(lens=None, B=1, T=8192, H=32),
    "b16x2048_32": dict(lens=None, B=16, T=2048, H=32),
    "long64k_32": dict(lens=None, B=1, T=65536, H=32),
    "fixed16": dict(lens=None, B=1, T=8192, H=16),
}
FLASHKDA_RATIO = {"fixed96": 5.9, "varlen6_96": 5.5, "v1024x8_96": 4.6, "fixed64": 7.5, "varlen6_64": 6.0,
                  "v1024x8_64": 4.7, "fixed32": 12.4, "b16x2048_32": 4.7, "long64k_32": 12.1, "fixed16": 22.0}
K = 128


def make_inputs(case, gen):
    H = case["H"]
    if case["lens"]:
        lens = case["lens"]
        B, T = 1, sum(lens)
        cu = torch.tensor(list(itertools.accumulate([0] + lens)), dtype=torch.int64, device="cuda")
        N = len(lens)
    else:
        B, T, cu, N = case["B"], case["T"], None, case["B"]
    dev = "cuda"
    rnd = lambda *s: torch.randn(*s, generator=gen, device=dev).to(torch.bfloat16)  # noqa: E731
    x = dict(q=rnd(B, T, H, K), k=rnd(B, T, H, K), v=rnd(B, T, H, K), g=rnd(B, T, H, K), beta=rnd(B, T, H),
             A_log=torch.rand(H, generator=gen, device=dev), dt_bias=torch.rand(H * K, generator=gen, device=dev),
             h0=torch.randn(N, H, K, K, generator=gen, device=dev), cu=cu)
    x["out"] = torch.empty_like(x["v"])
    x["ht"] = torch.empty_like(x["h0"])
    x["bytes"] = B * T * H * (4 * 2 * K + 2 + 2 * K) + 2 * N * H * K * K * 4
    return x


def time_ms(fn, reps, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--fla", nargs="*", default=[], help="cases to time fla's Triton chunk_kda on ('all')")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.environ["FLA_FLASH_KDA"] = "0"  # fla must time its own Triton path, not dispatch to us
    import flash_kda

    fla_cases = list(CASES) if args.fla == ["all"] else args.fla
    chunk_kda = None
    if fla_cases:
        from fla.ops.kda import chunk_kda
    commit = os.environ.get("FLASH_KDA_COMMIT") or subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    gen = torch.Generator(device="cuda")
    gen.seed()
    rows = []
    for name in args.cases:
        x = make_inputs(CASES[name], gen)
        src = torch.empty(x["bytes"] // 2, dtype=torch.uint8, device="cuda").fill_(1)
        dst = torch.empty_like(src)

        def ours():
            flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], K ** -0.5, x["out"], x["A_log"], x["dt_bias"],
                          -5.0, x["h0"], x["ht"], x["cu"])

        # Our call is captured in a CUDA graph and replayed, so that the Python layer's checks (a host
        # copy of cu_seqlens) stay out of the kernel time; fla runs eagerly as users call it.
        ours()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ours()
        t_ours = time_ms(graph.replay, args.reps)
        t_copy = time_ms(lambda: dst.copy_(src), args.reps)
        row = dict(case=name, H=CASES[name]["H"], bytes=x["bytes"], commit=commit, reps=args.reps,
                   ours_ms=statistics.median(t_ours), ours_ms_min=min(t_ours), ours_ms_max=max(t_ours),
                   copy_ms=statistics.median(t_copy))
        row["floor_ratio"] = row["ours_ms"] / row["copy_ms"]
        row["flashkda_floor_ratio"] = FLASHKDA_RATIO[name]
        if name in fla_cases:
            def fla():
                with torch.no_grad():
                    return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=K ** -0.5,
                                     initial_state=x["h0"], output_final_state=True, use_qk_l2norm_in_kernel=True,
                                     use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, safe_gate=True,
                                     lower_bound=-5.0, state_v_first=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                                     cu_seqlens=x["cu"])
            t_fla = time_ms(fla, args.reps, warmup=3)
            row["fla_ms"] = statistics.median(t_fla)
            row["fla_over_ours"] = row["fla_ms"] / row["ours_ms"]
            o_fla, _ = fla()
            row["ours_vs_fla_out_rel"] = float((x["out"].float() - o_fla.float()).norm() / o_fla.float().norm())
        rows.append(row)
        print(json.dumps(row), flush=True)
        del x, src, dst
        torch.cuda.empty_cache()
    print(f"\n{'case':12s} {'ours ms':>8s} {'floor ms':>8s} {'ratio':>6s} {'FlashKDA':>8s} {'fla ms':>7s} {'fla/ours':>8s}")
    for r in rows:
        fla_ms = f"{r['fla_ms']:7.3f}" if "fla_ms" in r else "      -"
        fla_x = f"{r['fla_over_ours']:8.2f}" if "fla_ms" in r else "       -"
        print(f"{r['case']:12s} {r['ours_ms']:8.3f} {r['copy_ms']:8.3f} {r['floor_ratio']:6.2f} "
              f"{r['flashkda_floor_ratio']:8.1f} {fla_ms} {fla_x}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
