"""`python -m flash_kda.bench`: the CPU suite on tiny shapes writes consistent JSON and markdown,
reports merge, plots render (when matplotlib is installed), the recorded commit is flash-kda's own,
the case list, FlashKDA's call (through a stand-in for its extension that runs flash-kda's CPU
backend) and the CUDA rows' report. No timing assertions; nothing here needs a GPU."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import flash_kda
from flash_kda.bench import cases, cli, flashkda, report, speed, timing

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
        assert "targets" not in x  # goals and published times are H200 figures: CUDA rows only
    assert rows[1]["N"] == 3 and rows[1]["T"] == 64 and rows[2]["N"] == 2
    md = (out / "bench.md").read_text()
    assert "## Prefill speed" in md and "host memcpy" in md
    for x in rows:
        assert f"`{x['case']}`" in md and f"{x['floor_ratio']:.2f}" in md
    printed = capsys.readouterr().out
    assert "- speed: floor ratio" in printed and f"wrote {out / 'bench.json'}, {out / 'bench.md'}" in printed
    assert "| `t64_1` |" not in printed  # the tables are in bench.md, not dumped on the terminal


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


def test_report_merges_parts(tmp_path, capsys):
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
    assert f"wrote {md}, {merged}" in capsys.readouterr().err  # says what it wrote

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
    assert cases.nbytes(dict(B=1, T=8192, H=96)) == 1020788736  # fixed96: 1 x 8192 tokens, 96 heads


def test_case_list():
    """One list: the prefill cases and the serving shapes make the CUDA suite; groups select them."""
    assert list(cases.GPU_CASES) == [*cases.PREFILL_CASES, *cases.SERVING_CASES]
    assert list(cases.PREFILL_CASES) == ["fixed96", "varlen6_96", "v1024x8_96", "fixed64", "varlen6_64",
                                         "v1024x8_64", "fixed32", "b16x2048_32", "long64k_32", "fixed16"]
    s = cases.SERVING_CASES
    assert {k: s["fixed12"][k] for k in ("B", "T", "H")} == dict(B=1, T=8192, H=12)
    assert {k: s["h8_8k"][k] for k in ("B", "T", "H")} == dict(B=1, T=8192, H=8)
    assert {k: s["h4_64k"][k] for k in ("B", "T", "H")} == dict(B=1, T=65536, H=4)
    assert s["mix20k"]["lens"] == [20000] + [300] * 15 and s["mix20k"]["H"] == 8
    assert cases.describe(s["mix20k"]) == "20000 + 15 x 300"
    heads = [c["H"] for c in cases.GPU_CASES.values()]
    assert heads == sorted(heads, reverse=True)  # grouped by H: fla autotunes once per H
    assert [c["name"] for c in cli.speed_cases_of(["serving"], [], "cpu")] == list(s)
    assert [c["name"] for c in cli.speed_cases_of(None, [], "cuda")] == list(cases.GPU_CASES)
    assert [c["name"] for c in cli.speed_cases_of(None, [], "cpu")] == list(cases.CPU_CASES)
    assert [c["name"] for c in cli.speed_cases_of(["fixed96", "prefill"], ["T=32,H=1"], "cpu")] == \
        ["fixed96", *cases.PREFILL_CASES, "t32_1"]
    # targets: the suite's case carries them, another shape under the same name does not
    assert cases.targets(dict(s["h8_8k"], name="h8_8k")) == dict(goal_ms=0.10, published={"cuLA": 0.318})
    assert cases.targets(dict(s["h4_64k"], name="h4_64k"))["published"] == {"cuLA": 0.97}
    assert cases.targets(dict(cases.PREFILL_CASES["fixed96"], name="fixed96")) == dict(goal_ratio=2.0)
    assert cases.targets(dict(B=1, T=4096, H=8, name="h8_8k")) == {}
    assert cases.targets(dict(B=1, T=8192, H=8, name="mine")) == {}
    assert set(cases.PUBLISHED) == {n for c in cases.GPU_CASES.values() for n in c.get("published", {})}


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_case_file_is_the_suite():
    """cases.json beside cases.py (shipped with the package) is where the CUDA suite comes from: the
    groups load into PREFILL_CASES, SERVING_CASES and TOOL_ONLY_CASES, in the file's order, each case
    the file's object without its name."""
    path = os.path.join(os.path.dirname(cases.__file__), cases.CASES_FILE)
    with open(path) as f:
        text = f.read()
    data = json.loads(text)
    assert cases.load_cases() == cases.load_cases(text)
    for group, suite in (("prefill", cases.PREFILL_CASES), ("serving", cases.SERVING_CASES),
                         ("tool_only", cases.TOOL_ONLY_CASES)):
        assert [c["name"] for c in data[group]] == list(suite)
        for c in data[group]:
            assert suite[c["name"]] == {k: v for k, v in c.items() if k != "name"}
    assert not set(cases.TOOL_ONLY_CASES) & set(cases.GPU_CASES)  # the Python suite times the safe gate
    assert {c.get("gate", "safe") for c in cases.GPU_CASES.values()} == {"safe"}
    assert {c["gate"] for c in cases.TOOL_ONLY_CASES.values()} == {"softplus"}


@pytest.mark.parametrize("bad, message", [
    (dict(name="x", B=1, T=8, H=2, nope=1), "unknown field(s) nope"),
    (dict(name="x", B=1, T=8, lens=[8], H=2), "either lens or B and T"),
    (dict(name="x", B=1, H=2), "either lens or B and T"),
    (dict(name="x", lens=[], H=2), "lens must be"),
    (dict(name="x", lens=[3, 0], H=2), "lens must be"),
    (dict(name="x", B=1, T=8), "H must be"),
    (dict(name="x y", B=1, T=8, H=2), "name"),
    (dict(name="x", B=1, T=8, H=2, gate="bounded"), "gate must be"),
    (dict(name="x", B=1, T=8, H=2, goal_ms=-1), "goal_ms"),
    (dict(name="x", B=1, T=8, H=2, published=[1]), "published"),
])
def test_case_file_is_checked(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cases.check_case(bad)
    groups = {"prefill": [bad], "serving": [], "tool_only": []}
    with pytest.raises(ValueError, match=re.escape(message)):
        cases.load_cases(json.dumps(groups))
    twice = {"prefill": [dict(name="a", B=1, T=8, H=2)], "serving": [dict(name="a", lens=[8], H=2)],
             "tool_only": []}
    with pytest.raises(ValueError, match="used twice"):
        cases.load_cases(json.dumps(twice))


def _tool_header(tmp_path, json_text):
    """cmake/BenchCases.cmake run as a script on `json_text`: (return code, header text, output)."""
    src, out = tmp_path / "cases.json", tmp_path / "bench_cases.h"
    src.write_text(json_text)
    script = os.path.join(ROOT, "cmake", "BenchCases.cmake")
    r = subprocess.run(["cmake", f"-DJSON={src}", f"-DOUT={out}", "-P", script], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, out.read_text() if out.exists() else None, r.stdout + r.stderr


HEADER_ENTRY = re.compile(r'^  \{"(\w+)", "(\w+)", \{([\d, ]*)\}, (\d+), (\d+), (\d+), (true|false)\}, \\$', re.M)


def test_tool_header_holds_the_same_cases(tmp_path):
    """The C++ benchmark's and GPU tests' cases (tests/gpu/cuda_common.cuh, bench_cases()) are the
    header CMake generates from the same file: every case of every group, in order, with its shape
    and gate."""
    if subprocess.run(["cmake", "--version"], capture_output=True).returncode != 0:
        pytest.skip("cmake is not installed")
    path = os.path.join(os.path.dirname(cases.__file__), cases.CASES_FILE)
    with open(path) as f:
        text = f.read()
    rc, header, log = _tool_header(tmp_path, text)
    assert rc == 0, log
    got = [(name, group, [int(n) for n in lens.split(",") if n.strip()], int(B), int(T), int(H), sp == "true")
           for name, group, lens, B, T, H, sp in HEADER_ENTRY.findall(header)]
    want = [(name, group, c.get("lens", []), c.get("B", 0) if "lens" not in c else 0,
             c.get("T", 0) if "lens" not in c else 0, c["H"], c.get("gate") == "softplus")
            for group, suite in cases.load_cases(text).items() for name, c in suite.items()]
    assert got == want and len(got) == header.count("\n  {")
    assert "#define FLASH_KDA_BENCH_CASES" in header
    # the configure step stops on a bad file, naming the case
    bad = json.loads(text)
    bad["serving"][0]["lens"] = [300]
    rc, _, log = _tool_header(tmp_path, json.dumps(bad))
    assert rc != 0 and "case fixed12: give either lens or B and T" in log
    bad = json.loads(text)
    bad["prefill"][1]["Hv"] = 3
    rc, _, log = _tool_header(tmp_path, json.dumps(bad))
    assert rc != 0 and 'case varlen6_96: unknown field "Hv"' in log


def test_tool_checks_name_cases_of_the_file():
    """The cases the GPU forward test (tests/gpu/test_cuda_forward.cu) runs against the fp32 GPU
    recurrence, by name, are cases of the file or of the C++ benchmark's own K = V = 64 cases, which
    bench_cases() (tests/gpu/cuda_common.cuh) appends to the file's (a renamed case would otherwise
    drop out of the check silently)."""
    with open(os.path.join(ROOT, "tests", "gpu", "test_cuda_forward.cu")) as f:
        source = f.read()
    with open(os.path.join(ROOT, "tests", "gpu", "cuda_common.cuh")) as f:
        common = f.read()
    checked = re.search(r"const char\* const checked\[\] = \{([^}]*)\}", source).group(1)
    forms = re.search(r"const FormRun forms\[\] = \{(.*?)\};", source, re.S).group(1)
    names = re.findall(r'"(\w+)"', checked) + re.findall(r'\{"(\w+)",', forms)
    assert len(names) > 8
    tool_cases = set(re.findall(r'c\.push_back\(\{"(\w+)", "tool_only",', common))
    assert {"fixed96_d64", "fixed16_d64"} <= tool_cases
    file_cases = {n for suite in cases.load_cases().values() for n in suite}
    assert not tool_cases & file_cases, "a tool case with the name of a case of the file"
    assert set(names) <= file_cases | tool_cases, set(names) - file_cases - tool_cases
    # the C++ benchmark times the same list
    with open(os.path.join(ROOT, "bench", "cpp", "kda_bench.cu")) as f:
        bench = f.read()
    assert '#include "cuda_common.cuh"' in bench and "bench_cases()" in bench


def test_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["speed", "--cases", "nope", "--out", str(tmp_path)])
    assert e.value.code == 2 and "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["sped", "--out", str(tmp_path)])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["speed", "--flashkda", "maybe", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--flashkda" in capsys.readouterr().err
    # e2e needs CUDA and fla: a clear message and exit status 2 on the CPU
    assert cli.main(["e2e", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "end-to-end needs CUDA" in capsys.readouterr().err


def _git_repo(path):
    """A git repository at `path` with one commit; returns that commit."""
    path.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    for cmd in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", *cmd], cwd=path, check=True, env=env, capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_module_entry_point_records_flash_kdas_commit(tmp_path):
    """Run from inside another git repository: the results name flash-kda's build, not that
    repository's commit."""
    other = _git_repo(tmp_path / "elsewhere")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "flash_kda.bench", "--shape", "T=16,H=1", "--reps", "1",
                        "--device", "cpu", "--no-plots", "--no-progress", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path / "elsewhere")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "t16_1" in r.stdout and "| `t16_1` |" in (out / "bench.md").read_text()
    meta = json.loads((out / "bench.json").read_text())["meta"]
    assert meta["commit"] != other and other[:12] not in r.stdout
    assert meta["commit"] == report.build_info()["commit"]
    assert meta["versions"]["flash_kda"] == report.build_info()["version"]


def test_build_info_comes_from_the_build_not_the_shell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _git_repo(tmp_path)  # the shell sits in some other repository
    baked = types.SimpleNamespace(version="9.9.9", commit="ab" * 20, commit_source="git", dirty=False, cuda=False)
    monkeypatch.setitem(sys.modules, "flash_kda._build_info", baked)
    monkeypatch.setattr(flash_kda, "_build_info", baked, raising=False)
    assert report.build_info() == dict(version="9.9.9", commit="ab" * 20, dirty=False, commit_from="build (git)")
    # no baked module: the package's own checkout, when it is imported from one ...
    monkeypatch.setitem(sys.modules, "flash_kda._build_info", None)  # import now raises ImportError
    monkeypatch.delattr(flash_kda, "_build_info", raising=False)
    source = tmp_path / "src"
    (source / "python" / "flash_kda").mkdir(parents=True)
    (source / "python" / "flash_kda" / "__init__.py").write_text("")
    head = _git_repo(source)
    monkeypatch.setattr(flash_kda, "__file__", str(source / "python" / "flash_kda" / "__init__.py"))
    info = report.build_info()
    assert info["commit"] == head and info["commit_from"] == "the source checkout"
    # ... and unknown anywhere else, whatever repository the shell is in
    (tmp_path / "site" / "flash_kda").mkdir(parents=True)
    monkeypatch.setattr(flash_kda, "__file__", str(tmp_path / "site" / "flash_kda" / "__init__.py"))
    assert report.build_info()["commit"] is None


def test_builtin_progress_bar_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    with timing.Progress(2, "test") as bar:
        bar.step("a")
        bar.write("line")
        bar.update()
        bar.update()
    captured = capsys.readouterr()
    assert "line" in captured.out and "2/2" in captured.err


# Synthetic H200-like medians (ms) per case: flash-kda, floor, fla (None: skipped), FlashKDA (None: rejected).
_SYNTHETIC = {
    "fixed96": (1.29, 0.248, 3.30, 1.40),
    "varlen6_96": (1.03, 0.269, None, 1.39),
    "fixed32": (0.91, 0.092, 1.98, None),
    "h8_8k": (0.88, 0.020, 1.06, 0.82),
    "mix20k": (2.10, 0.052, None, 1.95),
    "h4_64k": (6.74, 0.079, 2.17, 6.08),
}


def _synthetic_gpu_results():
    """A results object shaped like an H200 run (fla, FlashKDA, targets, e2e), its speed rows made by
    the suite's own row builder, for the report and plots."""
    meta = dict(commit="0" * 40, dirty=False, date="2026-11-29 00:00 UTC", command="python -m flash_kda.bench all",
                backend="cuda", device="NVIDIA H200", sm_count=132, versions=dict(flash_kda="0.1.0", fla="0.6.0"))
    rows = []
    for name, (ours, floor, fla, fk) in _SYNTHETIC.items():
        case = dict(cases.GPU_CASES[name], name=name)
        spread = lambda m: timing.summarize([m * 0.99, m, m * 1.02])  # noqa: E731
        impls = {"flash-kda": spread(ours)}
        extra = {}
        if fla is None:
            extra["fla_skipped"] = "time budget (200 s) spent before a new H"
        else:
            impls["fla"] = spread(fla)
            extra.update(ours_vs_fla_out_rel=4.4e-3, ours_vs_fla_state_rel=2.5e-3)
        if fk is None:
            extra["flashkda_skipped"] = "FlashKDA rejected the call: cu_seqlens must be int64"
        else:
            impls["FlashKDA"] = spread(fk)
            extra.update(ours_vs_flashkda_out_rel=5.7e-3, ours_vs_flashkda_state_rel=4.7e-3,
                         flashkda_timing="CUDA graph replay")
        rows.append(speed._row(case, cases.nbytes(case), impls, spread(floor), device="cuda", **extra))
    acc = [dict(case=n, what=c["what"], B=1, T=256, N=1, H=32, lens=None, bf16_out_floor=1.7e-3,
                impls={"flash-kda": dict(out_rel=1.8e-3, state_rel=3e-4, out_ok=True, state_ok=True),
                       "fla": dict(out_rel=4.1e-3, state_rel=2.6e-3, out_ok=False, state_ok=True)})
           for n, c in cases.ACCURACY_CASES.items()]
    e2e = []
    # rows of the safe gate as older results files hold them (no gate or route), and softplus rows
    for cfg, mlp, T in (("kimi-linear", True, 8192), ("kimi-linear", False, 32768), ("k3-shard", True, 8192),
                        ("kimi-linear-softplus", True, 8192), ("kimi-linear-softplus", False, 32768)):
        t_fla, t_ours, t_noop, s = 20.0, 16.0, 12.0, 2.2
        if cfg == "kimi-linear-softplus":
            t_fla, s = 24.0, 2.9
        f = (t_fla - t_noop) / t_fla
        extra = dict(gate="softplus", lower_bound=None, route="chunk_kda") if cfg.endswith("softplus") else {}
        e2e.append(dict(config=cfg, what="synthetic", hidden=2304, heads=32, head_dim=128, mlp=mlp,
                        intermediate=9216 if mlp else None, layers=4, tokens=T, t_fla_ms=t_fla, t_flash_kda_ms=t_ours,
                        t_noop_ms=t_noop, f=f, f_from_op=f, s=s, amdahl=1 / (1 - f + f / s), measured=t_fla / t_ours,
                        flash_kda_calls_per_forward={"fla": 0, "flash-kda": 4, "no-op": 0},
                        ours_vs_fla_out_rel=4e-3, dispatch_ok=cfg != "k3-shard", **extra,
                        **({"dispatch_rejected": "FlashKDA requires safe_gate=True"} if cfg == "k3-shard" else {})))
    return {"schema": report.SCHEMA, "meta": meta, "speed": dict(meta=meta, rows=rows),
            "accuracy": dict(meta=meta, rows=acc), "e2e": dict(meta=meta, rows=e2e)}


def test_cuda_rows_carry_flashkda_and_targets():
    rows = {r["case"]: r for r in _synthetic_gpu_results()["speed"]["rows"]}
    r = rows["h8_8k"]
    assert math.isclose(r["flashkda_ms"], 0.82) and math.isclose(r["flashkda_over_ours"], 0.82 / 0.88)
    assert math.isclose(r["flashkda_floor_ratio"], 0.82 / 0.020) and math.isclose(r["fla_over_ours"], 1.06 / 0.88)
    assert r["targets"] == dict(goal_ms=0.10, published={"cuLA": 0.318})
    assert rows["fixed96"]["targets"] == dict(goal_ratio=2.0) and "targets" not in rows["mix20k"]
    assert "flashkda_ms" not in rows["fixed32"] and "fla_ms" not in rows["varlen6_96"]
    assert report.goal_met(rows["fixed96"]) is False and report.goal_met(rows["mix20k"]) is None
    # a CPU row of the same case carries no H200 targets
    cpu = speed._row(dict(cases.GPU_CASES["h8_8k"], name="h8_8k"), 1, {"flash-kda": timing.summarize([1.0])},
                     timing.summarize([0.5]))
    assert "targets" not in cpu


def test_markdown_of_a_gpu_shaped_run():
    text = report.markdown(_synthetic_gpu_results(), image_prefix="bench/results/h200", title="H200")
    assert "device-to-device copy" in text and "| `fixed96` |" in text
    head = next(line for line in text.splitlines() if line.startswith("| case |"))
    for col in ("goal", "FlashKDA ms (floor ratio)", "FlashKDA ÷ flash-kda", "fla ms (floor ratio)",
                "fla ÷ flash-kda", "cuLA (published) ms", "out vs FlashKDA", "out vs fla"):
        assert f"| {col} |" in head, col
    h8 = next(line for line in text.splitlines() if line.startswith("| `h8_8k` |"))
    assert "≤ 0.10 ms ✗" in h8 and "0.820 (41.0)" in h8 and "0.93×" in h8 and "| 0.318 |" in h8
    assert "ratio ≤ 2.0 ✗" in text and "| 0.970 |" in text
    assert "cuLA (inclusionAI/cuLA)" in text and "CUDA graph replay" in text
    assert "FlashKDA skipped on `fixed32` (FlashKDA rejected the call" in text
    assert "fla skipped on `varlen6_96` (time budget" in text
    assert "4.10e-03 ✗" in text  # fla above the out limit is marked
    assert "## End-to-end prefill" in text and "**FAILED**" in text and "safe_gate" in text
    e2e_head = next(line for line in text.splitlines() if line.startswith("| model |"))
    assert "| gate |" in e2e_head and "| flash-kda calls |" in e2e_head
    e2e_rows = [line for line in text.splitlines() if line.startswith("| `kimi-linear")]
    assert len(e2e_rows) == 4
    for line in e2e_rows[:2]:  # rows without a gate: the safe gate through fla's dispatch
        assert "| safe (−5) |" in line and "| ok (fla's dispatch) |" in line
    sp8k, sp32k = e2e_rows[2:]
    assert sp8k.startswith("| `kimi-linear-softplus` (hidden 2304, 32×128) | softplus (no bound) | "
                           "4 × (KDA + MLP 9216) | 8192 |")
    assert "| 24.00 | 16.00 | 12.00 | 0.500 | 2.90× |" in sp8k
    assert "| **1.500×** | ok (`flash_kda.chunk_kda`) |" in sp8k
    assert "| 4 × (KDA) | 32768 |" in sp32k
    assert "Softplus (no bound): fla's unbounded gate" in text and "`flash_kda.chunk_kda`, called with the same" in text
    e2e_summary = text.split("## Summary")[1].split("##")[0]
    assert "- end-to-end, kimi-linear-softplus (softplus gate) + MLP, 8K tokens: measured 1.500×" in e2e_summary
    assert "- end-to-end, kimi-linear-softplus (softplus gate) KDA only, 32K tokens" in e2e_summary
    # a report of the safe stacks alone does not explain the softplus ones
    results = _synthetic_gpu_results()
    results["e2e"]["rows"] = [r for r in results["e2e"]["rows"] if "gate" not in r]
    assert "Softplus" not in report.md_e2e(results["e2e"]) and "Safe gate (−5)" in report.md_e2e(results["e2e"])
    summary = text.split("## Summary")[1].split("##")[0]
    assert "at or under the goal on 0 of 5 cases with one" in summary
    assert "FlashKDA ÷ flash-kda" in summary and "flash-kda faster on 2 of 5 cases" in summary
    assert "faster than cuLA's published time on 0 of 2 cases" in summary
    for png in ("speed.png", "floor_ratio.png", "accuracy.png", "e2e.png"):
        assert f"(bench/results/h200/{png})" in text
    # the report names no file outside the repository (the developers' notes)
    for outside in (name + ".md" for name in ("BENCH", "SPEC", "GPU")):
        assert outside not in text
    # a CUDA run where FlashKDA could not be imported says why, and how to time it
    results = _synthetic_gpu_results()
    results["speed"]["flashkda"] = dict(timed=False, why="ModuleNotFoundError: No module named 'flash_kda_C'")
    assert "FlashKDA not timed (ModuleNotFoundError" in report.md_speed(results["speed"])


def test_older_results_files_still_render(tmp_path):
    """Results of schema flash_kda.bench/1 (goals in an "anchor", no FlashKDA) load and render."""
    results = _synthetic_gpu_results()
    results["schema"] = "flash_kda.bench/1"
    for r in results["speed"]["rows"]:
        goal = r.pop("targets", {}).get("goal_ratio")
        r["anchor"] = dict(flashkda_ms=1.0, fla_ms=2.0, flashkda_ratio=5.0, goal_ratio=goal)
        for k in [k for k in r if "flashkda" in k]:
            del r[k]
        r["impls"].pop("FlashKDA", None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(results))
    text = report.markdown(report.load([str(path)]))
    assert "ratio ≤ 2.0" in text and "FlashKDA" not in text.split("## Prefill speed")[1].split("##")[0]


def test_flashkda_is_optional(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, flashkda.MODULE, None)  # import flash_kda_C raises ImportError
    fk, why = flashkda.load()
    assert fk is None and "flash_kda_C" in why
    fk, info = cli._flashkda("auto")
    assert fk is None and info["timed"] is False
    assert "FlashKDA not timed" in capsys.readouterr().out
    assert cli._flashkda("none") == (None, dict(timed=False, why="--flashkda none"))


def test_flashkda_module_is_found_on_the_path(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    (tmp_path / f"{flashkda.MODULE}.py").write_text("def get_workspace_size(t, h, n):\n    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, flashkda.MODULE, raising=False)
    fk, why = flashkda.load()
    assert why is None and fk.__file__ == str(tmp_path / f"{flashkda.MODULE}.py")
    monkeypatch.delitem(sys.modules, flashkda.MODULE)


class _FakeFlashKDA:
    """Stands in for FlashKDA's extension: its signature and argument checks (contiguous bf16
    activations, dt_bias [H, K], int64 cu_seqlens, a workspace of get_workspace_size bytes), computed
    by flash-kda's CPU backend."""

    def __init__(self):
        self.sizes = []

    def get_workspace_size(self, tokens, heads, seqs):
        self.sizes.append((tokens, heads, seqs))
        return 64 * tokens * heads + seqs

    def fwd(self, q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound, initial_state=None,
            final_state=None, cu_seqlens=None):
        import torch

        B, T, H, K = q.shape
        if dt_bias.shape != (H, K) or (cu_seqlens is not None and cu_seqlens.dtype != torch.int64):
            raise RuntimeError("dt_bias must be [H, D]; cu_seqlens must be int64")
        if workspace.numel() != self.get_workspace_size(B * T, H, initial_state.shape[0]):
            raise RuntimeError("workspace too small")
        flash_kda.fwd(q, k, v, g, beta, scale, out, A_log, dt_bias.reshape(-1), lower_bound,
                      initial_state, final_state, cu_seqlens, backend="cpu")


@pytest.mark.parametrize("case", [dict(B=2, T=40, H=2, name="fixed"), dict(lens=[30, 1, 17], H=3, name="varlen")])
def test_flashkda_call_on_the_suites_inputs(case):
    """make_call passes the suite's inputs in FlashKDA's order and shapes: the stand-in, which
    computes with flash-kda's CPU backend, gives exactly flash-kda's own result."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(3)
    x = speed._cuda_inputs(torch, case, gen, dev="cpu")
    fk = _FakeFlashKDA()
    call, out, final_state = flashkda.make_call(fk, torch, x, case)
    call()
    B, T, N, _ = cases.expand(case)
    assert fk.sizes[0] == (B * T, case["H"], N)
    flash_kda.fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], cases.SCALE, x["out"], x["A_log"], x["dt_bias"],
                  cases.LOWER_BOUND, x["h0"], x["ht"], x["cu"], backend="cpu")
    assert torch.equal(out, x["out"]) and torch.equal(final_state, x["ht"])
    assert out.data_ptr() != x["out"].data_ptr()  # FlashKDA writes its own outputs


def test_time_flashkda_paths(monkeypatch):
    """How FlashKDA is timed: from a CUDA graph, eagerly where capture fails, not at all (with the
    reason) where it rejects the call. The CUDA pieces are replaced by host stand-ins."""
    torch = pytest.importorskip("torch")
    case = dict(B=1, T=24, H=1, name="t")
    x = speed._cuda_inputs(torch, case, torch.Generator().manual_seed(1), dev="cpu")
    fake_torch = types.SimpleNamespace(**{n: getattr(torch, n) for n in ("empty", "empty_like", "uint8", "int64")},
                                       cuda=types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(speed, "time_cuda", lambda t, fn, reps, warmup: timing.time_host(fn, reps, warmup))
    replays = []
    monkeypatch.setattr(speed, "_capture", lambda t, fn: types.SimpleNamespace(replay=lambda: replays.append(fn())))
    r = speed._time_flashkda(fake_torch, _FakeFlashKDA(), x, case, reps=2, warmup=0)
    assert r["flashkda_timing"] == "CUDA graph replay" and r["summary"]["reps"] == 2 and len(replays) == 3

    def no_capture(t, fn):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(speed, "_capture", no_capture)
    r = speed._time_flashkda(fake_torch, _FakeFlashKDA(), x, case, reps=2, warmup=0)
    assert r["flashkda_timing"] == ("eager calls (its CUDA graph capture failed: operation not permitted when "
                                    "stream is capturing)")
    out, state = r["outputs"]
    assert np.isfinite(out.float().numpy()).all() and np.isfinite(state.numpy()).all()
    x["cu"] = None
    x["dt_bias"] = x["dt_bias"][:64]  # a shape FlashKDA rejects
    r = speed._time_flashkda(fake_torch, _FakeFlashKDA(), x, case, reps=2, warmup=0)
    assert set(r) == {"flashkda_skipped"} and "rejected the call" in r["flashkda_skipped"]


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


# ---- end-to-end: the configurations, the command line, the softplus stack's route, the report ----

# The keyword arguments fla 0.6.0's KimiDeltaAttention.forward (fla.layers.kda) passes to chunk_kda,
# which the flash-kda variant of a softplus stack hands to flash_kda.chunk_kda as they are.
FLA_LAYER_CALL = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "output_final_state",
                  "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
                  "safe_gate", "lower_bound", "state_v_first", "cu_seqlens")


def test_e2e_configurations():
    from flash_kda.bench import e2e

    assert list(e2e.CONFIGS) == ["kimi-linear", "kimi-linear-softplus", "k3-shard"]
    sp, kl = e2e.CONFIGS["kimi-linear-softplus"], e2e.CONFIGS["kimi-linear"]
    # the same Kimi-Linear-48B-like stack, with the gate it was trained with
    assert {k: v for k, v in sp.items() if k not in ("gate", "what")} == \
        {k: v for k, v in kl.items() if k not in ("gate", "what")}
    assert sp["gate"] == "softplus" and kl["gate"] == "safe" and e2e.CONFIGS["k3-shard"]["gate"] == "safe"
    assert e2e.GATES["softplus"] == dict(safe_gate=False, lower_bound=None, route="chunk_kda")
    assert e2e.GATES["safe"] == dict(safe_gate=True, lower_bound=cases.LOWER_BOUND, route="fla-dispatch")
    assert set(report.E2E_ROUTES) == {g["route"] for g in e2e.GATES.values()}  # the report names every route

    def fla_fn(**kw):
        return "fla"

    def ours_fn(**kw):
        return "flash-kda"

    safe = e2e.routes("safe", fla_fn, ours_fn)
    soft = e2e.routes("softplus", fla_fn, ours_fn)
    assert safe["fla"] == ("0", fla_fn) and safe["flash-kda"] == ("1", fla_fn)  # fla's own dispatch
    assert soft["fla"] == ("0", fla_fn) and soft["flash-kda"] == ("0", ours_fn)  # flash_kda.chunk_kda
    assert safe["no-op"][1] is e2e._noop and soft["no-op"][1] is e2e._noop
    with pytest.raises(ValueError, match="gate 'bounded'"):
        e2e.routes("bounded", fla_fn, ours_fn)
    assert e2e.expected_calls(dict(sp, layers=3)) == {"fla": 0, "flash-kda": 3, "no-op": 0}


def test_e2e_command_line(tmp_path, capsys):
    from flash_kda.bench import e2e

    assert [e2e.parse_tokens(t) for t in ("8192", "8K", "32k", " 32K ", "100")] == [8192, 8192, 32768, 32768, 100]
    for bad in ("8M", "", "K", "1.5K", "-8K"):
        with pytest.raises(ValueError):
            e2e.parse_tokens(bad)
    args = cli._parser().parse_intermixed_args(["e2e", "--configs", "kimi-linear-softplus", "--tokens", "8K", "32K"])
    assert args.parts == ["e2e"] and args.configs == ["kimi-linear-softplus"] and args.tokens == [8192, 32768]
    assert cli._parser().parse_intermixed_args(["e2e"]).tokens == [8192, 32768]  # the default: 8K and 32K
    with pytest.raises(SystemExit) as e:
        cli.main(["e2e", "--tokens", "8M", "--out", str(tmp_path)])
    assert e.value.code == 2 and "8K" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["e2e", "--tokens", "64", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--tokens must be > 64" in capsys.readouterr().err
    # an unknown configuration is reported as such, before (and whether or not) e2e can run here
    with pytest.raises(SystemExit) as e:
        cli.main(["e2e", "--configs", "kimi-linear-sp", "--device", "cpu", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unknown e2e config(s) kimi-linear-sp" in err and "kimi-linear-softplus" in err


def test_e2e_degrades_gracefully(tmp_path, capsys, monkeypatch):
    """Without CUDA the softplus stack is not run: e2e alone fails with the reason, beside other
    parts it is skipped with it."""
    from flash_kda.bench import e2e

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert e2e.unavailable() == "no CUDA device"
    assert cli.main(["e2e", "--configs", "kimi-linear-softplus", "--tokens", "8K", "--out", str(tmp_path)]) == 2
    assert "end-to-end needs CUDA, fla and flash-kda's CUDA build: no CUDA device." in capsys.readouterr().err
    rc, out = _run(tmp_path, "speed", "e2e", "--configs", "kimi-linear-softplus", "--shape", "T=16,H=1",
                   "--reps", "1", "--no-plots")
    assert rc == 0 and "skipping it" in capsys.readouterr().err
    r = _load(out)
    assert "speed" in r and "e2e" not in r


def _tiny_layer_call(torch, T=80, H=2, K=128, gate="softplus"):
    """The keyword arguments fla's KimiDeltaAttention passes to chunk_kda (FLA_LAYER_CALL), on CPU
    tensors: raw q, k, v, g, beta logits, A_log [H] and a flat dt_bias [H * K] as fla creates them."""
    import math as m

    gen = torch.Generator().manual_seed(5)
    bf16 = lambda *s: torch.randn(*s, generator=gen).to(torch.bfloat16)  # noqa: E731
    softplus = gate == "softplus"
    A_log = (torch.empty(H).uniform_(1, 16, generator=gen).log() if softplus else torch.zeros(H))
    dt = torch.exp(torch.rand(H * K, generator=gen) * (m.log(0.1) - m.log(0.001)) + m.log(0.001)).clamp(min=1e-4)
    kw = dict(q=bf16(1, T, H, K), k=bf16(1, T, H, K), v=bf16(1, T, H, K), g=bf16(1, T, H, K), beta=bf16(1, T, H),
              A_log=A_log, dt_bias=dt + torch.log(-torch.expm1(-dt)), initial_state=None, output_final_state=True,
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              allow_neg_eigval=False, safe_gate=not softplus, lower_bound=None if softplus else cases.LOWER_BOUND,
              state_v_first=True, cu_seqlens=None)
    assert tuple(kw) == FLA_LAYER_CALL
    return kw


def test_softplus_route_takes_the_layers_call():
    """The flash-kda variant of the softplus stack: flash_kda.chunk_kda with exactly the arguments
    fla's layer passes to fla's chunk_kda, within the limits of docs/spec.md against float64 (CPU)."""
    torch = pytest.importorskip("torch")
    from flash_kda.bench import e2e

    kw = _tiny_layer_call(torch)
    _, fn = e2e.routes("softplus", None, flash_kda.chunk_kda)["flash-kda"]
    with torch.inference_mode():
        o, ht = fn(**kw)
    out64, ht64 = flash_kda.reference(kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], cases.SCALE, kw["A_log"],
                                      kw["dt_bias"], None)
    rel = lambda x, ref: float(np.linalg.norm(x.double().numpy() - ref) / np.linalg.norm(ref))  # noqa: E731
    assert rel(o, out64) < 4e-3 and rel(ht, ht64) < 3e-3
    noop_o, noop_ht = e2e._noop(**kw)
    assert noop_o.shape == kw["v"].shape and noop_ht is None


def test_fla_layer_passes_what_the_softplus_route_takes():
    """fla's KimiDeltaAttention calls chunk_kda with the keywords FLA_LAYER_CALL lists (all of which
    flash_kda.chunk_kda takes), and the e2e stacks build it with the gate of their configuration:
    the softplus stack with fla's own A_log initialisation (log U(1, 16)), kept in fp32."""
    import inspect

    from conftest import require_in_ci

    torch = pytest.importorskip("torch")
    require_in_ci("fla")
    pytest.importorskip("fla.layers.kda")
    import fla.layers.kda

    from flash_kda.bench import e2e

    source = inspect.getsource(fla.layers.kda.KimiDeltaAttention.forward)
    call = re.search(r"= chunk_kda\((.*?)\n\s*\)", source, re.S).group(1)
    assert tuple(re.findall(r"(\w+)=", call)) == FLA_LAYER_CALL
    params = inspect.signature(flash_kda.chunk_kda).parameters
    assert set(FLA_LAYER_CALL) <= set(params)
    tiny = dict(hidden=256, heads=2, head_dim=128, intermediate=512, layers=2)
    for name in ("kimi-linear", "kimi-linear-softplus"):
        model = e2e._build(torch, dict(e2e.CONFIGS[name], **tiny), device="cpu")
        gate = e2e.GATES[e2e.CONFIGS[name]["gate"]]
        assert len(model.blocks) == 2
        for block in model.blocks:
            attn = block.attn
            assert attn.safe_gate == gate["safe_gate"] and attn.lower_bound == gate["lower_bound"]
            assert attn.A_log.dtype == torch.float32 and attn.dt_bias.dtype == torch.float32
            assert attn.q_proj.weight.dtype == torch.bfloat16
            if gate["lower_bound"] is None:  # fla's softplus initialisation: exp(A_log) in [1, 16]
                assert bool(((attn.A_log.exp() >= 1 - 1e-5) & (attn.A_log.exp() <= 16 + 1e-4)).all())
                assert attn.A_log.std() > 0
            else:
                assert bool((attn.A_log == 0).all())


def test_docs_show_the_layers_call():
    """docs/torch.md ("In a model built from fla's layers") calls flash-kda with the arguments fla's
    layer passes, all of them (test_fla_layer_passes_what_the_softplus_route_takes checks fla's side)."""
    with open(os.path.join(ROOT, "docs", "torch.md")) as f:
        page = f.read()
    call = re.search(r"o, ht = fla\.layers\.kda\.chunk_kda\((.*?)\)\n", page, re.S).group(1)
    assert tuple(re.findall(r"(\w+)=", call)) == FLA_LAYER_CALL


class _FakeStack:
    """Stands in for the e2e model on the CPU: `layers` blocks, each calling the layer module's
    chunk_kda with fla's layer arguments (as fla.layers.kda.KimiDeltaAttention does)."""

    def __init__(self, torch, kda_mod, layers, gate):
        self.kw = _tiny_layer_call(torch, gate=gate)
        block = lambda x: kda_mod.chunk_kda(**self.kw)[0]  # noqa: E731
        self.blocks = [block] * layers

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _fake_fla(monkeypatch, dispatches_softplus=False):
    """fla's modules for _measure on the CPU: fla's chunk_kda dispatching as fla 0.6.0 does (to
    flash_kda.fwd when FLA_FLASH_KDA is not 0 and the gate is the safe one; `dispatches_softplus`:
    also the softplus gate, whatever FLA_FLASH_KDA says, as some other fla might), else a stand-in
    for Triton (flash-kda's CPU backend, through its chunk_kda: no flash_kda.fwd call)."""
    def fla_chunk_kda(**kw):
        safe = kw["safe_gate"] and kw["lower_bound"] is not None
        if (safe and os.environ.get("FLA_FLASH_KDA") != "0") or (not safe and dispatches_softplus):
            o = kw["v"].new_empty(kw["v"].shape)
            H, K = kw["v"].shape[2], kw["q"].shape[3]
            final = kw["v"].new_zeros((1, H, K, K), dtype=kw["A_log"].dtype)
            flash_kda.fwd(kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], K ** -0.5, o, kw["A_log"], kw["dt_bias"],
                          kw["lower_bound"], None, final)
            return o, final
        return flash_kda.chunk_kda(**kw)

    fla = types.ModuleType("fla")
    ops, ops_kda = types.ModuleType("fla.ops"), types.ModuleType("fla.ops.kda")
    layers, layers_kda = types.ModuleType("fla.layers"), types.ModuleType("fla.layers.kda")
    ops_kda.chunk_kda = layers_kda.chunk_kda = fla_chunk_kda
    for name, mod in (("fla", fla), ("fla.ops", ops), ("fla.ops.kda", ops_kda), ("fla.layers", layers),
                      ("fla.layers.kda", layers_kda), ("fla.ops.kda.backends", None)):
        monkeypatch.setitem(sys.modules, name, mod)
    return layers_kda, fla_chunk_kda


@pytest.mark.parametrize("config", ["kimi-linear-softplus", "kimi-linear"])
def test_e2e_measure_on_the_cpu(config, monkeypatch):
    """_measure itself, every variant and the op alone, with the CUDA pieces and fla's modules
    replaced by CPU stand-ins: the flash-kda variant of the softplus stack calls flash_kda.chunk_kda
    once per layer, the fla variant never reaches flash-kda, the row records gate and route, and the
    layer module's chunk_kda and FLA_FLASH_KDA are restored."""
    torch = pytest.importorskip("torch")
    from flash_kda.bench import e2e

    kda_mod, fla_fn = _fake_fla(monkeypatch)
    monkeypatch.setattr(e2e, "time_cuda", lambda t, fn, reps, warmup=5: timing.time_host(fn, reps, warmup))
    monkeypatch.setenv("FLA_FLASH_KDA", "untouched")
    fake_torch = types.SimpleNamespace(inference_mode=torch.inference_mode,
                                       cuda=types.SimpleNamespace(synchronize=lambda: None))
    cfg = dict(e2e.CONFIGS[config], layers=3)
    model = _FakeStack(torch, kda_mod, 3, cfg["gate"])
    with timing.Progress(1, "test", False) as bar:
        row = e2e._measure(fake_torch, model, torch.empty(1, 80, 8), cfg, config, True, 2, bar)
    gate = cfg["gate"]
    assert row["dispatch_ok"] and "dispatch_rejected" not in row, row
    assert row["flash_kda_calls_per_forward"] == {"fla": 0, "flash-kda": 3, "no-op": 0}
    assert row["gate"] == gate and row["route"] == e2e.GATES[gate]["route"]
    assert row["lower_bound"] == e2e.GATES[gate]["lower_bound"] and row["tokens"] == 80 and row["layers"] == 3
    assert row["ours_vs_fla_out_rel"] < 4e-3  # the stand-in for Triton is flash-kda's CPU backend
    assert set(row["stack"]) == set(e2e.MODES) and set(row["op"]) == {"fla", "flash-kda"}
    assert row["stack"]["fla"]["reps"] == 2 and row["op"]["flash-kda"]["reps"] == 10
    for key in ("f", "s", "amdahl", "measured"):
        assert math.isfinite(row[key])
    assert kda_mod.chunk_kda is fla_fn and os.environ["FLA_FLASH_KDA"] == "untouched"
    assert "DISPATCH FAILED" not in e2e._line(row)


def test_e2e_measure_reports_a_fla_that_dispatches_softplus(monkeypatch):
    """Were fla to send the softplus gate to flash-kda itself, its variant would not be Triton: the
    row says so rather than compare flash-kda with itself."""
    torch = pytest.importorskip("torch")
    from flash_kda.bench import e2e

    kda_mod, _ = _fake_fla(monkeypatch, dispatches_softplus=True)
    monkeypatch.setattr(e2e, "time_cuda", lambda t, fn, reps, warmup=5: timing.time_host(fn, reps, warmup))
    monkeypatch.setenv("FLA_FLASH_KDA", "1")
    fake_torch = types.SimpleNamespace(inference_mode=torch.inference_mode,
                                       cuda=types.SimpleNamespace(synchronize=lambda: None))
    cfg = dict(e2e.CONFIGS["kimi-linear-softplus"], layers=2)
    model = _FakeStack(torch, kda_mod, 2, "softplus")
    with timing.Progress(1, "test", False) as bar:
        row = e2e._measure(fake_torch, model, torch.empty(1, 80, 8), cfg, "kimi-linear-softplus", False, 1, bar)
    assert not row["dispatch_ok"] and row["flash_kda_calls_per_forward"]["fla"] == 2
    assert "the fla variant is not fla's Triton path" in row["dispatch_rejected"]
    assert "DISPATCH FAILED" in e2e._line(row)
    assert "**FAILED** (`flash_kda.chunk_kda`" in report.md_e2e(dict(rows=[row]))


def test_e2e_verdicts():
    from flash_kda.bench import e2e

    cfg = dict(e2e.CONFIGS["kimi-linear-softplus"], layers=4)
    assert e2e._verdict(None, cfg, {"fla": 0, "flash-kda": 4, "no-op": 0}, {}) is None
    why = e2e._verdict(None, cfg, {"fla": 0, "flash-kda": 2, "no-op": 0}, {})
    assert why == "flash_kda.chunk_kda ran 2 times a forward, expected 4"
    safe = dict(e2e.CONFIGS["kimi-linear"], layers=4)
    assert "expected" in e2e._verdict(None, safe, {"fla": 0, "flash-kda": 3, "no-op": 0}, {})
