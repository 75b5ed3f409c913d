"""`python -m flash_kda.bench`: the CPU suite on tiny shapes writes consistent JSON and markdown,
reports merge, plots render (when matplotlib is installed). No timing assertions."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from flash_kda.bench import cases, cli, report, timing

TINY = ["--shape", "T=64,H=1", "--shape", "lens=20+1+43,H=2,name=tiny_varlen", "--shape", "B=2,T=17,H=1"]


def _run(tmp_path, *args, name="out"):
    out = tmp_path / name
    rc = cli.main([*args, "--device", "cpu", "--no-progress", "--out", str(out)])
    return rc, out


def _load(out):
    with open(out / "bench.json") as f:
        return json.load(f)


def test_speed_cpu_writes_consistent_json_and_markdown(tmp_path, capsys):
    rc, out = _run(tmp_path, "speed", *TINY, "--reps", "2", "--warmup", "0", "--no-plots")
    assert rc == 0
    r = _load(out)
    assert r["schema"] == report.SCHEMA
    meta = r["meta"]
    assert meta["backend"] == "cpu" and meta["device"] and meta["versions"]["flash_kda"]
    assert "commit" in meta and meta["command"].startswith("python -m flash_kda.bench")
    rows = r["speed"]["rows"]
    assert [x["case"] for x in rows] == ["t64_1", "tiny_varlen", "b2x17_1"]
    shapes = {"t64_1": dict(B=1, T=64, H=1), "tiny_varlen": dict(lens=[20, 1, 43], H=2),
              "b2x17_1": dict(B=2, T=17, H=1)}
    for x in rows:
        ours = x["impls"]["flash-kda"]
        assert set(x["impls"]) == {"flash-kda"}  # no fla on the CPU
        assert ours["reps"] == 2 and len(ours["times_ms"]) == 2
        assert ours["min_ms"] <= ours["median_ms"] <= ours["max_ms"]
        assert x["ours_ms"] == ours["median_ms"] and x["floor_ms"] == x["floor"]["median_ms"]
        assert x["floor_ms"] > 0 and x["ours_ms"] > 0
        assert math.isclose(x["floor_ratio"], x["ours_ms"] / x["floor_ms"])
        assert x["bytes"] == cases.nbytes(shapes[x["case"]])
        assert "anchor" not in x
    assert rows[1]["N"] == 3 and rows[1]["T"] == 64 and rows[2]["N"] == 2
    md = (out / "bench.md").read_text()
    assert "## Prefill speed" in md and "host memcpy" in md
    for x in rows:
        assert f"`{x['case']}`" in md and f"{x['floor_ratio']:.2f}" in md
    assert "wrote" in capsys.readouterr().out


def test_accuracy_cpu(tmp_path):
    rc, out = _run(tmp_path, "accuracy", "--acc-heads", "1", "--no-plots")
    assert rc == 0
    rows = _load(out)["accuracy"]["rows"]
    assert [x["case"] for x in rows] == list(cases.ACCURACY_CASES)
    for x in rows:
        m = x["impls"]["flash-kda (cpu)"]
        assert m["out_ok"] and m["state_ok"], x
        assert 0 < x["bf16_out_floor"] < 4e-3 and x["H"] == 1
    short = rows[-1]
    assert short["case"] == "many_short" and len(short["lens"]) == short["N"] == 64 and sum(short["lens"]) == short["T"]
    md = (out / "bench.md").read_text()
    assert "## Accuracy against float64" in md and "large \\|v\\|" in md


def test_report_merges_parts(tmp_path):
    _, a = _run(tmp_path, "speed", "--shape", "T=32,H=1", "--reps", "1", "--no-plots", name="a")
    _, b = _run(tmp_path, "accuracy", "--acc-cases", "normal", "--acc-heads", "1", "--no-plots", name="b")
    md, merged = tmp_path / "r.md", tmp_path / "merged.json"
    assert cli.main(["report", str(a / "bench.json"), str(b / "bench.json"), "--md", str(md),
                     "--json", str(merged), "--title", "T"]) == 0
    r = json.loads(merged.read_text())
    assert "speed" in r and "accuracy" in r and "e2e" not in r
    text = md.read_text()
    assert text.startswith("# T\n") and "## Prefill speed" in text and "## Accuracy" in text
    assert "![" not in text  # no plots asked for


def test_report_merges_rows_of_one_part(tmp_path):
    """Two accuracy runs with different cases merge into one part holding both; a repeated case
    takes the later file's row."""
    _, a = _run(tmp_path, "accuracy", "--acc-cases", "normal", "large_v", "--acc-heads", "1", "--no-plots",
                name="a")
    _, b = _run(tmp_path, "accuracy", "--acc-cases", "large_v", "many_short", "--acc-heads", "1",
                "--no-plots", name="b")
    rows_b = {r["case"]: r for r in json.loads((b / "bench.json").read_text())["accuracy"]["rows"]}
    md, merged = tmp_path / "r.md", tmp_path / "merged.json"
    assert cli.main(["report", str(a / "bench.json"), str(b / "bench.json"), "--md", str(md),
                     "--json", str(merged)]) == 0
    part = json.loads(merged.read_text())["accuracy"]
    assert [r["case"] for r in part["rows"]] == ["normal", "large_v", "many_short"]
    assert part["rows"][1] == rows_b["large_v"] and part["rows"][2] == rows_b["many_short"]
    assert len(part["meta"]["also_from"]) == 1
    text = md.read_text()
    assert "`many_short`" in text and "`normal`" in text and "accuracy (some rows): from another run" in text


def test_shape_parsing():
    assert cases.parse_shape("T=8192,H=48") == dict(B=1, T=8192, H=48, name="t8192_48")
    c = cases.parse_shape("lens=1300+547+1024x2,H=64")
    assert c["lens"] == [1300, 547, 1024, 1024] and c["H"] == 64
    assert cases.parse_shape("b=4,t=2048,h=32,name=x") == dict(B=4, T=2048, H=32, name="x")
    for bad in ("T=8192,Q=1", "lens=0+3", "lens=5,T=3", "H=0", "8192"):
        with pytest.raises(ValueError):
            cases.parse_shape(bad)
    assert cases.nbytes(dict(B=1, T=8192, H=96)) == 1020788736  # BENCH.md's fixed96


def test_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["speed", "--cases", "nope", "--out", str(tmp_path)])
    assert e.value.code == 2 and "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["sped", "--out", str(tmp_path)])
    assert e.value.code == 2
    # e2e needs CUDA and fla: a clear message and exit status 2 on the CPU
    assert cli.main(["e2e", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "end-to-end needs CUDA" in capsys.readouterr().err


def test_module_entry_point(tmp_path):
    r = subprocess.run([sys.executable, "-m", "flash_kda.bench", "--shape", "T=16,H=1", "--reps", "1",
                        "--device", "cpu", "--no-plots", "--no-progress", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| `t16_1` |" in r.stdout and (tmp_path / "bench.json").exists()


def test_builtin_progress_bar_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    with timing.Progress(2, "test") as bar:
        bar.step("a")
        bar.write("line")
        bar.update()
        bar.update()
    captured = capsys.readouterr()
    assert "line" in captured.out and "2/2" in captured.err


def _synthetic_gpu_results():
    """A results object shaped like an H200 run (fla, anchors, e2e), for the report and plots."""
    meta = dict(commit="0" * 40, dirty=False, date="2026-11-29 00:00 UTC", command="python -m flash_kda.bench all",
                backend="cuda", device="NVIDIA H200", sm_count=132, versions=dict(flash_kda="0.1.0", fla="0.6.0"))
    speed = []
    for name in ("fixed96", "varlen6_96", "fixed32"):
        case = dict(cases.GPU_CASES[name], name=name)
        t = timing.summarize([1.0, 1.1, 1.2])
        f = timing.summarize([2.0, 2.1, 2.2])
        c = timing.summarize([0.25, 0.26, 0.27])
        B, T, N, _ = cases.expand(case)
        row = dict(case=name, batch=cases.describe(case), lens=case.get("lens"), B=B, T=T, N=N, H=case["H"],
                   bytes=cases.nbytes(case), floor=c, impls={"flash-kda": t}, floor_ms=c["median_ms"],
                   ours_ms=t["median_ms"], floor_ratio=t["median_ms"] / c["median_ms"], anchor=cases.ANCHORS[name])
        if name != "varlen6_96":
            row["impls"]["fla"] = f
            row.update(fla_ms=f["median_ms"], fla_floor_ratio=f["median_ms"] / c["median_ms"],
                       fla_over_ours=f["median_ms"] / t["median_ms"], ours_vs_fla_out_rel=4e-3)
        else:
            row["fla_skipped"] = "time budget (200 s) spent before a new H"
        speed.append(row)
    acc = [dict(case=n, what=c["what"], B=1, T=256, N=1, H=32, lens=None, bf16_out_floor=1.7e-3,
                impls={"flash-kda": dict(out_rel=1.8e-3, state_rel=3e-4, out_ok=True, state_ok=True),
                       "fla": dict(out_rel=4.1e-3, state_rel=2.6e-3, out_ok=False, state_ok=True)})
           for n, c in cases.ACCURACY_CASES.items()]
    e2e = []
    for cfg, mlp, T in (("kimi-linear", True, 8192), ("kimi-linear", False, 32768), ("k3-shard", True, 8192)):
        t_fla, t_ours, t_noop, s = 20.0, 16.0, 12.0, 2.2
        f = (t_fla - t_noop) / t_fla
        e2e.append(dict(config=cfg, what="synthetic", hidden=2304, heads=32, head_dim=128, mlp=mlp,
                        intermediate=9216 if mlp else None, layers=4, tokens=T, t_fla_ms=t_fla, t_flash_kda_ms=t_ours,
                        t_noop_ms=t_noop, f=f, f_from_op=f, s=s, amdahl=1 / (1 - f + f / s), measured=t_fla / t_ours,
                        flash_kda_calls_per_forward={"fla": 0, "flash-kda": 4, "no-op": 0},
                        ours_vs_fla_out_rel=4e-3, dispatch_ok=cfg != "k3-shard",
                        **({"dispatch_rejected": "FlashKDA requires safe_gate=True"} if cfg == "k3-shard" else {})))
    return {"schema": report.SCHEMA, "meta": meta, "speed": dict(meta=meta, rows=speed),
            "accuracy": dict(meta=meta, rows=acc), "e2e": dict(meta=meta, rows=e2e)}


def test_markdown_of_a_gpu_shaped_run():
    text = report.markdown(_synthetic_gpu_results(), image_prefix="bench/results/h200", title="H200")
    assert "device-to-device copy" in text and "| `fixed96` |" in text
    assert "FlashKDA ratio" in text and "≤ 2.0" in text and "fla ÷ flash-kda" in text
    assert "skipped" in text and "time budget" in text
    assert "4.10e-03 ✗" in text  # fla above the out limit is marked
    assert "## End-to-end prefill" in text and "**FAILED**" in text and "safe_gate" in text
    for png in ("speed.png", "floor_ratio.png", "accuracy.png", "e2e.png"):
        assert f"(bench/results/h200/{png})" in text


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    results = _synthetic_gpu_results()
    written = report.plot(results, str(tmp_path))
    assert sorted(p.rsplit("/", 1)[-1] for p in written) == ["accuracy.png", "e2e.png", "floor_ratio.png", "speed.png"]
    for p in written:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # and through the command, on a real CPU run
    rc, out = _run(tmp_path, "speed", "--shape", "T=32,H=1", "--reps", "1", name="cmd")
    assert rc == 0 and (out / "speed.png").exists() and (out / "floor_ratio.png").exists()
    assert "![speed.png](speed.png)" in (out / "bench.md").read_text()


def test_missing_matplotlib_is_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, out = _run(tmp_path, "speed", "--shape", "T=16,H=1", "--reps", "1")
    assert rc == 0 and not list(out.glob("*.png"))
    captured = capsys.readouterr()
    assert "matplotlib is not installed" in captured.err and "no plots: matplotlib is not installed" in captured.out
