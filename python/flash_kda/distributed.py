"""Context-parallel prefill: the tokens of one long prompt (or of a packed batch) spread over the
ranks of a ``torch.distributed`` process group, each rank holding a contiguous shard of them
(docs/distributed.md).

The recurrence is affine in the state: over a shard, ``S_end = S_start P + R`` with ``R`` the end
state from a zero start and ``P`` the shard's K x K transition (the product of its factors
``Diag(alpha_t)(I - beta_t k_t k_t^T)``; its rows evolve like state rows with ``v = 0`` from the
identity). Each rank computes, for the sequence that crosses into the next rank, ``R`` and (when
that sequence also entered from the previous rank) ``P``; one ``all_gather`` exchanges them; each
rank composes the pieces of the ranks before it into the true start state of its first sequence
and runs that sequence's tokens again from it. Every local computation is ``flash_kda.fwd`` on the
rank's own device (the CPU backends with gloo, CUDA with NCCL).
"""

import torch
import torch.distributed as dist

from ._fwd import fwd as _local_fwd


def _sizes(group, local_tokens, device):
    """(token offset of this rank, total tokens) from one all_gather of the shard lengths."""
    world = dist.get_world_size(group)
    mine = torch.tensor([local_tokens], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    lens = [int(x.item()) for x in every]
    rank = dist.get_rank(group)
    return sum(lens[:rank]), sum(lens)


def _pieces(bounds, t0, t1):
    """(n, start, end) in global positions for each sequence n with tokens in [t0, t1), in order."""
    pieces = []
    for n in range(len(bounds) - 1):
        lo, hi = max(bounds[n], t0), min(bounds[n + 1], t1)
        if lo < hi:
            pieces.append((n, lo, hi))
    return pieces


def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
        cu_seqlens=None, *, group=None, token_offset=None, total_tokens=None, backend=None, allow_neg_eigval=False):
    """Context-parallel ``flash_kda.fwd`` over the ranks of ``group`` (None: the default group).

    Every rank passes its shard of the tokens: ``q, k, v, g, beta, out`` of shape ``[B, T_r, ...]``
    (T_r may differ between ranks, and may be 0), and the same ``scale``, ``A_log``, ``dt_bias``,
    ``lower_bound``, ``allow_neg_eigval``.

    - ``cu_seqlens`` None: a fixed batch of B sequences of ``sum(T_r)`` tokens, each split along T.
    - ``cu_seqlens`` (int32/int64 ``[N + 1]``, the same on every rank): the *global* boundaries of
      N sequences packed into ``sum(T_r)`` tokens (B = 1); a sequence may span any number of ranks.

    ``initial_state`` ``[N, HV, V, K]`` (bf16/fp32, may be None: zeros) is read on the rank that holds
    a sequence's first token; ``final_state`` ``[N, HV, V, K]`` is written on the rank that holds its
    last (an empty sequence: the rank whose range holds its position, the last rank when that is the
    end). Other ranks do not touch those rows. ``token_offset`` / ``total_tokens``: this rank's first
    global token and the total, when the caller knows them; otherwise one extra ``all_gather`` of
    the shard lengths finds them. With ``cu_seqlens`` the boundaries are read on the host (a
    synchronisation for CUDA tensors).

    Communication: one ``all_gather`` of ``S * (HV * V * K + HV * K * K + 1)`` fp32 values a rank,
    S = B (fixed batch) or 1 (packed). Returns None; raises ValueError naming the argument for an
    inconsistent shard, and whatever ``flash_kda.fwd`` raises for the local calls.
    """
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    B, T_r, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dev = q.device
    if (token_offset is None) != (total_tokens is None):
        raise ValueError("token_offset and total_tokens: give both or neither")
    if token_offset is None:
        t0, total = _sizes(group, T_r, dev)
    else:
        t0, total = int(token_offset), int(total_tokens)
        if t0 < 0 or t0 + T_r > total:
            raise ValueError(f"token_offset: {t0} + {T_r} local tokens lies outside [0, {total}]")
    t1 = t0 + T_r
    if cu_seqlens is None:
        bounds = None
        N = B
    else:
        if B != 1:
            raise ValueError(f"q: batch {B} with cu_seqlens; packed sequences need B == 1")
        bounds = [int(x) for x in cu_seqlens.tolist()]
        N = len(bounds) - 1
        if N < 0 or bounds[0] != 0 or bounds[-1] != total or any(a > b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"cu_seqlens: must rise from 0 to the total of the shards ({total})")
    for name, s in (("initial_state", initial_state), ("final_state", final_state)):
        if s is not None and tuple(s.shape) != (N, HV, V, K):
            raise ValueError(f"{name}: shape {tuple(s.shape)}, expected {(N, HV, V, K)}")

    f32 = dict(dtype=torch.float32, device=dev)

    def start_state(n):
        return initial_state[n].float() if initial_state is not None else torch.zeros(HV, V, K, **f32)

    def run(sl, init, final, cu=None, vv=None, oo=None):
        """flash_kda.fwd on the tokens sl of this shard."""
        _local_fwd(q[:, sl], k[:, sl], v[:, sl] if vv is None else vv, g[:, sl], beta[:, sl], scale,
                   out[:, sl] if oo is None else oo, A_log, dt_bias, lower_bound, init, final, cu,
                   backend=backend, allow_neg_eigval=allow_neg_eigval)

    def transition(sl, nseq):
        """P of the tokens sl for nseq sequences (the rows of the identity with v = 0)."""
        tl = sl.stop - sl.start
        vz = torch.zeros(nseq, tl, HV, K, dtype=v.dtype, device=dev)
        oz = torch.empty_like(vz)
        eye = torch.eye(K, **f32).expand(nseq, HV, K, K).contiguous()
        p = torch.empty(nseq, HV, K, K, **f32)
        run(sl, eye, p, vv=vz, oo=oz)
        return p

    # Pieces of sequences on this rank, in token order: (n, global start, global end).
    if bounds is None:
        pieces = [(n, t0, t1) for n in range(N)] if T_r > 0 else []
        empty = []
        seq_start = {n: 0 for n in range(N)}
        seq_end = {n: total for n in range(N)}
    else:
        pieces = _pieces(bounds, t0, t1)
        empty = [n for n in range(N) if bounds[n] == bounds[n + 1] and
                 (t0 <= bounds[n] < t1 or (bounds[n] == total and rank == world - 1))]
        seq_start = {n: bounds[n] for n in range(N)}
        seq_end = {n: bounds[n + 1] for n in range(N)}

    # Call 1: every piece from its start state (zeros where it entered from the previous rank).
    ends = torch.empty(len(pieces), HV, V, K, **f32)
    if pieces:
        init = torch.stack([torch.zeros(HV, V, K, **f32) if seq_start[n] < t0 else start_state(n)
                            for n, _, _ in pieces])
        if bounds is None:
            run(slice(0, T_r), init, ends)
        else:
            lens = [e - s for _, s, e in pieces]
            cu = torch.tensor([0] + lens, dtype=torch.int64, device=dev).cumsum(0)
            run(slice(pieces[0][1] - t0, pieces[-1][2] - t0), init, ends, cu)

    # The message: for each slot (B of them, or 1) the sequence crossing into the next rank, its
    # (P, R): P = 0 where it starts on this rank (then R is its true end state), P = I, R = 0 for a
    # rank without tokens it passes through. Sequence id -1: none.
    slots = N if bounds is None else 1
    width = 1 + HV * V * K + HV * K * K
    msg = torch.zeros(max(slots, 1), width, **f32)
    msg[:, 0] = -1
    crossing = []  # (slot, n)
    if bounds is None:
        if t1 < total:
            crossing = [(n, n) for n in range(N)]
    else:
        if pieces and seq_end[pieces[-1][0]] > t1:
            crossing = [(0, pieces[-1][0])]
        elif not pieces:
            through = [n for n in range(N) if seq_start[n] < t0 and seq_end[n] > t1]
            crossing = [(0, n) for n in through]
    if crossing:
        entered = [seq_start[n] < t0 for _, n in crossing]
        p_cont = None
        if pieces and any(entered):  # the crossing pieces that entered here cover the whole shard
            p_cont = transition(slice(0, T_r), len(crossing))
        for i, (slot, n) in enumerate(crossing):
            msg[slot, 0] = n
            if pieces:
                r = ends[len(pieces) - len(crossing) + i]
                p = p_cont[i] if entered[i] else torch.zeros(HV, K, K, **f32)
            else:
                r = torch.zeros(HV, V, K, **f32)
                p = torch.eye(K, **f32).expand(HV, K, K)
            msg[slot, 1:1 + HV * V * K] = r.reshape(-1)
            msg[slot, 1 + HV * V * K:] = p.reshape(-1)

    gathered = [torch.empty_like(msg) for _ in range(world)]
    dist.all_gather(gathered, msg, group=group)

    # The true start states of the pieces that entered from the previous rank: compose the ranks
    # before this one, S <- S P + R for each that carried the sequence.
    ids = [[int(x) for x in g_[:, 0].tolist()] for g_ in gathered[:rank]]  # one host copy each

    def entering_state(n):
        s = torch.zeros(HV, V, K, **f32)
        for r_ in range(rank):
            for slot, seq in enumerate(ids[r_]):
                if seq == n:
                    row = gathered[r_][slot]
                    r = row[1:1 + HV * V * K].reshape(HV, V, K)
                    p = row[1 + HV * V * K:].reshape(HV, K, K)
                    s = torch.bmm(s, p) + r
        return s

    true_ends = {}
    entered_pieces = [(i, n) for i, (n, s, _) in enumerate(pieces) if seq_start[n] < t0]
    if entered_pieces:
        # Call 3: those pieces again from their true start (the first piece; all B with a fixed batch).
        s_in = torch.stack([entering_state(n) for _, n in entered_pieces])
        fin = torch.empty_like(s_in)
        if bounds is None:
            run(slice(0, T_r), s_in, fin)
        else:
            _, _, e = pieces[0]
            run(slice(0, e - t0), s_in, fin)
        for (i, n), f in zip(entered_pieces, fin):
            true_ends[i] = f

    if final_state is not None:
        for i, (n, _, e) in enumerate(pieces):
            if seq_end[n] <= t1:
                final_state[n].copy_(true_ends.get(i, ends[i]))
        for n in empty:
            final_state[n].copy_(start_state(n))
