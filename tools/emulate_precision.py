"""Emulates, in NumPy, the rounding points of the CUDA forward (C-token chunks, tensor-core operands
rounded to bf16 or tf32, fp32 accumulation) and measures its error against the float64 recurrence.

Used to choose the operand precision of each product before spending GPU time; see docs/kernel.md.
    python tools/emulate_precision.py [--T 2048] [--H 4] [--chunk 16] [--ref start|mid] [--pairs]

--ref: where the intra-chunk decay factors of A and M are referenced. "start" (the CUDA kernels
today, C = 16): 2^{G_t} and 2^{-G_s} from the chunk's first token, which stay in fp32's range only
while |G| <= 126 (C = 16 at lower_bound -5: |G| <= 115). "mid": from the chunk's middle token, which
halves the range both need, so C = 32 stays within it (|G_t - G_mid| <= 115); the inter-chunk
factors (k_tilde, q_tilde from the start, k_dec to the end) are unchanged and only underflow.
"""
import argparse

import ml_dtypes
import numpy as np


def bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def tf32(x):
    x = np.asarray(x, np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0xFFF + ((b >> 13) & 1)) & 0xFFFFE000
    return b.astype(np.uint32).view(np.float32)


def fp32(x):
    return np.asarray(x, np.float32)


def f16(x):  # fp16 operands (the CUDA kernels' S, k_tilde, q_hat, k_dec, U): subnormals kept
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def inputs(rng, T, H, K, lb):
    q = bf16(rng.standard_normal((T, H, K)))
    k = bf16(rng.standard_normal((T, H, K)))
    v = bf16(rng.standard_normal((T, H, K)))
    g = bf16(rng.standard_normal((T, H, K)))
    beta = bf16(rng.standard_normal((T, H)))
    A_log = rng.uniform(0, 1, H).astype(np.float32)
    dt_bias = rng.uniform(0, 1, (H, K)).astype(np.float32)
    s0 = rng.standard_normal((H, K, K)).astype(np.float32)
    return q, k, v, g, beta, A_log, dt_bias, s0


def prep(q, k, g, beta, A_log, dt_bias, lb, scale):
    q = q.astype(np.float64); k = k.astype(np.float64)
    qh = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
    kh = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    x = np.exp(A_log.astype(np.float64))[None, :, None] * (g + dt_bias[None])
    a = lb / (1 + np.exp(-x))
    b = 1 / (1 + np.exp(-beta.astype(np.float64)))
    return qh * scale, kh, a, b


def reference(q, k, v, g, beta, A_log, dt_bias, s0, lb, scale):
    qs, kh, a, b = prep(q, k, g, beta, A_log, dt_bias, lb, scale)
    T, H, K = q.shape
    S = s0.astype(np.float64).copy()
    out = np.zeros((T, H, K))
    for t in range(T):
        S *= np.exp(a[t])[:, None, :]
        pred = np.einsum("hvk,hk->hv", S, kh[t])
        S += (b[t][:, None] * (v[t] - pred))[:, :, None] * kh[t][:, None, :]
        out[t] = np.einsum("hvk,hk->hv", S, qs[t])
    return out, S


def chunked(q, k, v, g, beta, A_log, dt_bias, s0, lb, scale, C, R_state, R_qk, R_w, R_t, R_u, R_kdec, R_m, R_am=None, R_uo=None,
            ref="start"):
    qs, kh, a, b = prep(q, k, g, beta, A_log, dt_bias, lb, scale)
    qs, kh, a, b = fp32(qs), fp32(kh), fp32(a), fp32(b)
    T, H, K = q.shape
    S = s0.astype(np.float32).copy()
    out = np.zeros((T, H, K), np.float32)
    for c0 in range(0, T, C):
        c1 = min(T, c0 + C)
        n = c1 - c0
        G = np.cumsum(a[c0:c1].transpose(1, 0, 2), axis=1)          # [H, n, K], fp32
        e = np.exp(G); gam = e[:, -1]                                  # [H, K]
        kc = kh[c0:c1].transpose(1, 0, 2); qc = qs[c0:c1].transpose(1, 0, 2)
        R_am = R_am or R_qk
        Kt = R_qk(kc * e); Qt = R_qk(qc * e)
        Kd = R_kdec(kc * (gam[:, None, :] / e) if ref == "start" else kc * np.exp(G[:, -1:, :] - G))
        Gr = G if ref == "start" else G - G[:, (n - 1) // 2:(n - 1) // 2 + 1, :]
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            er, rr = np.exp(Gr), np.exp(-Gr)                           # fp32: inf / 0 outside the range
            A = np.einsum("htc,hsc->hts", R_am(kc * er), R_am(kc * rr))
            Mq = np.einsum("htc,hsc->hts", R_am(qc * er), R_am(kc * rr))
        tril = np.tril(np.ones((n, n), bool), -1)
        A = np.where(tril, A, 0); Mq = R_m(np.where(np.tril(np.ones((n, n), bool)), Mq, 0))
        bc = b[c0:c1].T                                               # [H, n]
        L = bc[:, :, None] * A
        Tm = np.linalg.inv(np.eye(n)[None] + L.astype(np.float64)) * bc[:, None, :]
        Tm = R_t(Tm)
        Sb = R_state(S)
        Xk = np.einsum("hvc,htc->hvt", Sb, Kt)                        # [H, V, n]
        Xq = np.einsum("hvc,htc->hvt", Sb, Qt)
        W = R_w(v[c0:c1].transpose(1, 2, 0) - Xk)
        Uf = np.einsum("hvs,hts->hvt", W, Tm)                        # [H, V, n]
        Ut = R_u(Uf)
        O = Xq + np.einsum("hvs,hts->hvt", (R_uo or R_u)(Uf), Mq)
        out[c0:c1] = O.transpose(2, 0, 1)
        S = S * gam[:, None, :] + np.einsum("hvt,htc->hvc", Ut, Kd)
    return bf16(out), S


def half_chunk(kc, qc, a_c, bc, R_am):
    """One 16-token chunk as the preparation pass forms it (chunk-start references): tiles relative to
    its own start / end, A, M (M with scale in q), -T, in fp32."""
    n = kc.shape[1]
    G = np.cumsum(a_c, axis=1)
    e = np.exp(G); gam = e[:, -1]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        A = np.einsum("htc,hsc->hts", R_am(kc * e), R_am(kc * np.exp(-G)))
        Mq = np.einsum("htc,hsc->hts", R_am(qc * e), R_am(kc * np.exp(-G)))
    A = np.where(np.tril(np.ones((n, n), bool), -1), A, 0)
    Mq = np.where(np.tril(np.ones((n, n), bool)), Mq, 0)
    Tm = np.linalg.inv(np.eye(n)[None] + (bc[:, :, None] * A).astype(np.float64)) * bc[:, None, :]
    kt, qt = fp32(kc * e), fp32(qc * e)
    kd = fp32(kc * (gam[:, None, :] / e))
    return kt, qt, kd, gam, fp32(tf32(-Tm)), fp32(tf32(Mq))


def pairs(q, k, v, g, beta, A_log, dt_bias, s0, lb, scale):
    """32-token steps as the CUDA pair format computes them (docs/kernel.md, "32-token steps"): two
    16-token chunks a, b prepared with their own references; b's k_tilde and q_hat scaled by gamma_a,
    a's k_dec (kept in fp16) by gamma_b; the cross blocks A[b][a] = k_tilde_b k_dec_a^T and
    M[b][a] = q_tilde_b k_dec_a^T from fp16 operands, (-T)[b][a] = (-T_b) A[b][a] (-T_a) in fp32; then
    the consumer's step over 32 tokens with the fast path's roundings."""
    qs, kh, a, b = prep(q, k, g, beta, A_log, dt_bias, lb, scale)
    qs, kh, a, b = fp32(qs), fp32(kh), fp32(a), fp32(b)
    T, H, K = q.shape
    S = s0.astype(np.float32).copy()
    out = np.zeros((T, H, K), np.float32)
    C = 16
    for c0 in range(0, T, 2 * C):
        parts = []
        for h in range(2):
            lo, hi = min(T, c0 + h * C), min(T, c0 + (h + 1) * C)
            n = hi - lo
            kc = np.zeros((H, C, K), np.float32); qc = np.zeros((H, C, K), np.float32)
            ac = np.zeros((H, C, K), np.float32); bc = np.zeros((H, C), np.float32)
            vc = np.zeros((H, K, C), np.float32)
            if n > 0:
                kc[:, :n] = kh[lo:hi].transpose(1, 0, 2); qc[:, :n] = qs[lo:hi].transpose(1, 0, 2)
                ac[:, :n] = a[lo:hi].transpose(1, 0, 2); bc[:, :n] = b[lo:hi].T
                vc[:, :, :n] = v[lo:hi].transpose(1, 2, 0)
            parts.append((kc, qc, bc, vc) + half_chunk(kc, qc, ac, bc, tf32))
        (ka, qa, ba, va, kta, qta, kda, gama, nta, ma), (kb, qb, bb, vb, ktb, qtb, kdb, gamb, ntb, mb) = parts
        stash = f16(kda)
        A_ba = np.einsum("htc,hsc->hts", f16(ktb), stash)
        M_ba = tf32(np.einsum("htc,hsc->hts", f16(qtb / scale), stash) * scale)
        Y = np.einsum("htu,hus->hts", A_ba, nta)
        nt_ba = tf32(np.einsum("htu,hus->hts", ntb, Y))
        Z = np.zeros((H, C, C), np.float32)
        negT = np.concatenate([np.concatenate([nta, Z], 2), np.concatenate([nt_ba, ntb], 2)], 1)
        Mq = np.concatenate([np.concatenate([ma, Z], 2), np.concatenate([M_ba, mb], 2)], 1)
        Kt = f16(np.concatenate([kta, ktb * gama[:, None, :]], 1))
        Qt = f16(np.concatenate([qta / scale, qtb * gama[:, None, :] / scale], 1))
        Kd = f16(np.concatenate([stash * gamb[:, None, :], kdb], 1))
        gam = fp32(gama * gamb)
        Sb = f16(S)
        Xk = np.einsum("hvc,htc->hvt", Sb, Kt)
        Xq = np.einsum("hvc,htc->hvt", Sb, Qt) * scale
        W = np.concatenate([va, vb], 2) - Xk
        Uf = np.einsum("hvs,hts->hvt", tf32(W), -negT)
        O = Xq + np.einsum("hvs,hts->hvt", tf32(Uf), Mq)
        n = min(T, c0 + 2 * C) - c0
        out[c0:c0 + n] = O[:, :, :n].transpose(2, 0, 1)
        S = S * gam[:, None, :] + np.einsum("hvt,htc->hvc", f16(Uf), Kd)
    return bf16(out), S


def rel(x, ref):
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--ref", choices=["start", "mid"], default="start")
    ap.add_argument("--pairs", action="store_true", help="also the 32-token steps' pair format")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    K = 128; lb = -5.0; scale = K ** -0.5
    x = inputs(rng, args.T, args.H, K, lb)
    ref_o, ref_s = reference(*x, lb, scale)
    variants = {
        "all fp32": dict(R_state=fp32, R_qk=fp32, R_w=fp32, R_t=fp32, R_u=fp32, R_kdec=fp32, R_m=fp32),
        "all bf16": dict(R_state=bf16, R_qk=bf16, R_w=bf16, R_t=bf16, R_u=bf16, R_kdec=bf16, R_m=bf16),
        "state tf32, rest bf16": dict(R_state=tf32, R_qk=bf16, R_w=bf16, R_t=bf16, R_u=bf16, R_kdec=bf16, R_m=bf16),
        "state+qk tf32": dict(R_state=tf32, R_qk=tf32, R_w=bf16, R_t=bf16, R_u=bf16, R_kdec=bf16, R_m=bf16),
        "state+qk+kdec tf32": dict(R_state=tf32, R_qk=tf32, R_w=bf16, R_t=bf16, R_u=bf16, R_kdec=tf32, R_m=bf16),
        "all tf32": dict(R_state=tf32, R_qk=tf32, R_w=tf32, R_t=tf32, R_u=tf32, R_kdec=tf32, R_m=tf32),
        "bf16, W/T/U/M tf32": dict(R_state=bf16, R_qk=bf16, R_w=tf32, R_t=tf32, R_u=tf32, R_kdec=bf16, R_m=tf32),
        # the prepared plans' fast path: fp16 S, k_tilde, q_hat, k_dec and U in the large products; A, M, T
        # and U for the output in tf32
        "fp16 products, T/M tf32": dict(R_state=f16, R_qk=f16, R_w=fp32, R_t=tf32, R_u=f16, R_kdec=f16, R_m=tf32,
                                       R_am=tf32, R_uo=tf32),
    }
    print(f"T={args.T} H={args.H} C={args.chunk} ref={args.ref}")
    if args.pairs:
        o, s = pairs(*x, lb, scale)
        print(f"{'pairs (32-token steps)':28s} out {rel(o, ref_o):.2e}  state {rel(s, ref_s):.2e}")
    for name, kw in variants.items():
        o, s = chunked(*x, lb, scale, args.chunk, ref=args.ref, **kw)
        print(f"{name:28s} out {rel(o, ref_o):.2e}  state {rel(s, ref_s):.2e}")


if __name__ == "__main__":
    main()
