"""flash_kda.distributed: the context-parallel prefill over gloo with 2-4 processes on the CPU,
against the float64 oracle of the whole (unsharded) problem (tests/python/oracle.py)."""

import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

from oracle import recurrence, rel  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

K = V = 32
SCALE = K**-0.5
# name, world, lens (None: fixed batch), B, T (fixed), shard lengths, H, HV, initial dtype, lower_bound
# (weak decay where a sequence crosses several ranks, so that each shard's transition P matters)
CASES = [
    ("fixed, an empty shard", 3, None, 2, 100, [40, 0, 60], 2, 2, torch.float32, -0.1),
    ("varlen across 4 ranks", 4, [300, 17, 0, 250, 1], 1, None, [100, 250, 0, 218], 2, 2, torch.bfloat16, -5.0),
    ("one sequence on every rank", 4, [400], 1, None, [100, 120, 80, 100], 2, 4, torch.float32, -0.05),
    ("boundaries on the shard edges", 2, [64, 64, 0], 1, None, [64, 64], 1, 1, None, -3.0),
    ("unbounded gate", 2, [70, 90], 1, None, [100, 60], 2, 2, torch.float32, None),
    ("a rank with only an inner sequence", 3, [50, 30, 80], 1, None, [60, 20, 80], 2, 2, torch.float32, -5.0),
]


def _inputs(case, seed):
    name, world, lens, B, T, shards, H, HV, init_dtype, lower_bound = case
    rs = np.random.RandomState(seed)
    total = sum(lens) if lens is not None else T
    B = 1 if lens is not None else B
    N = len(lens) if lens is not None else B

    def bf16(shape, mul=1.0, add=0.0):
        return torch.from_numpy(rs.standard_normal(shape).astype(np.float32) * mul + add).to(torch.bfloat16)

    x = dict(q=bf16((B, total, H, K)), k=bf16((B, total, H, K)), v=bf16((B, total, HV, V)),
             g=bf16((B, total, HV, K)), beta=bf16((B, total, HV)))
    x["A_log"] = torch.from_numpy(rs.uniform(0, 1, HV).astype(np.float32))
    x["dt_bias"] = torch.from_numpy(rs.uniform(0, 1, (HV, K)).astype(np.float32))
    x["initial"] = None if init_dtype is None else torch.from_numpy(
        rs.standard_normal((N, HV, V, K)).astype(np.float32)).to(init_dtype)
    x["cu"] = None if lens is None else torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int64)
    return x, N, total


def _worker(rank, world, port, seed, outdir):
    from flash_kda import distributed as fkd

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for ci, case in enumerate(CASES):
        if case[1] != world:
            continue
        x, N, total = _inputs(case, seed + ci)
        shards = case[5]
        t0 = sum(shards[:rank])
        sl = slice(t0, t0 + shards[rank])
        HV = case[7]
        out = torch.full(x["v"][:, sl].shape, float("nan"), dtype=torch.bfloat16)
        final = torch.full((N, HV, V, K), float("nan"), dtype=torch.float32)
        kwargs = {}
        if ci % 2 == 0:  # both ways of finding the offsets
            kwargs = dict(token_offset=t0, total_tokens=total)
        fkd.fwd(x["q"][:, sl], x["k"][:, sl], x["v"][:, sl], x["g"][:, sl], x["beta"][:, sl], SCALE, out,
                x["A_log"], x["dt_bias"], case[9], x["initial"], final, x["cu"], **kwargs)
        torch.save({"out": out, "final": final}, os.path.join(outdir, f"case{ci}_rank{rank}.pt"))
    if rank == 0 and world == 2:  # errors, raised before anything is written
        x, N, total = _inputs(CASES[3], seed)
        errors = {}
        for key, kw in (("offset_alone", dict(token_offset=0)),
                        ("offset_outside", dict(token_offset=total, total_tokens=total))):
            try:
                fkd.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], SCALE, torch.empty_like(x["v"]), x["A_log"],
                        x["dt_bias"], -3.0, None, None, x["cu"], **kw)
                errors[key] = "no error"
            except ValueError as e:
                errors[key] = str(e)
        torch.save(errors, os.path.join(outdir, "errors.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process group per world size, every case of that size in it: {world: folder}."""
    seed = int(np.random.SeedSequence().entropy % (2**31 - 100))
    folders = {}
    for world in sorted({c[1] for c in CASES}):
        d = tmp_path_factory.mktemp(f"world{world}")
        mp.spawn(_worker, args=(world, _free_port(), seed, str(d)), nprocs=world, join=True)
        folders[world] = d
    return seed, folders


@pytest.mark.parametrize("ci", range(len(CASES)), ids=[c[0] for c in CASES])
def test_matches_the_whole_problem(runs, ci):
    seed, folders = runs
    case = CASES[ci]
    name, world, lens, B, T, shards, H, HV, init_dtype, lower_bound = case
    x, N, total = _inputs(case, seed + ci)
    ref_out, ref_final = recurrence(x["q"], x["k"], x["v"], x["g"], x["beta"], SCALE, x["A_log"], x["dt_bias"],
                                    lower_bound, x["initial"], x["cu"])
    parts = [torch.load(folders[world] / f"case{ci}_rank{r}.pt") for r in range(world)]
    out = torch.cat([p["out"] for p in parts], dim=1)
    assert not torch.isnan(out.float()).any(), "every row of out written"
    assert rel(out, ref_out) <= 4e-3
    # Each final state is written by exactly the rank that holds the sequence's last token (an empty
    # sequence: the rank whose range holds its position, the last rank at the end).
    bounds = [0, *np.cumsum(lens)] if lens is not None else None
    starts = np.concatenate([[0], np.cumsum(shards)])
    final = torch.full((N, HV, V, K), float("nan"))
    for n in range(N):
        if bounds is None:
            last = max(r for r in range(world) if shards[r] > 0)
        else:
            s, e = bounds[n], bounds[n + 1]
            pos = e - 1 if e > s else s
            last = world - 1 if pos >= total else next(r for r in range(world) if starts[r] <= pos < starts[r + 1])
        for r in range(world):
            written = not torch.isnan(parts[r]["final"][n]).any()
            assert written == (r == last), f"sequence {n}: rank {r} wrote its final state: {written}"
        final[n] = parts[last]["final"][n]
    assert rel(final, ref_final) <= 3e-3


def test_errors_name_the_argument(runs):
    seed, folders = runs
    errors = torch.load(folders[2] / "errors.pt")
    assert errors["offset_alone"].startswith("token_offset")
    assert errors["offset_outside"].startswith("token_offset")
