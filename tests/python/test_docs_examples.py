"""The code blocks of README.md and docs/*.md run as written (the convention of info strings and the
parser: tests/python/doc_blocks.py).

- every fenced block carries an info string of the convention, and no indented block holds code;
- ```python blocks run, each alone, in a fresh interpreter in an empty folder, and must exit 0 (their
  asserts check their results); ```python cuda blocks likewise where torch sees a CUDA GPU and
  flash-kda's CUDA backend is available, else they are skipped;
- ```cpp blocks are complete programs, compiled against a CPU-only build of flash-kda
  (add_subdirectory) and run; they must exit 0;
- ```python signature blocks equal inspect.signature of the functions they show, ```text schema
  blocks the schemas of the custom operators;
- the ```sh blocks and project files of docs/quickstart-cpp.md run in tests/python/test_quickstart.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import require_in_ci
from doc_blocks import (PAGES, SCRIPT_PAGES, blocks, cmake_configure, consumer_project, indented_blocks,
                        page_blocks, read_page)

ALL = [b for page in PAGES for b in page_blocks(page)]
OPTIONAL_MODULES = ("torch", "fla")  # a block importing one is skipped where it is missing (not in CI)


def _params(kinds):
    return [pytest.param(b, id=b.name, marks=[pytest.mark.cuda] if b.kind == "run-cuda" else [])
            for b in ALL if b.kind in kinds]


def _target(block):
    return re.sub(r"\W", "_", block.name)


def _imported(body):
    return {m.group(1) for m in re.finditer(r"^\s*(?:import|from)\s+(\w+)", body, re.M)}


def _cuda():
    try:
        import torch
    except ImportError:
        return False
    import flash_kda
    return torch.cuda.is_available() and flash_kda.cuda_available()


def run_python(body, folder):
    """One block as a script of its own, in a fresh interpreter, from an empty folder."""
    script = os.path.join(folder, "doc_example.py")  # a name no module of the examples has
    with open(script, "w") as f:
        f.write(body)
    return subprocess.run([sys.executable, script], cwd=folder, capture_output=True, text=True, timeout=600)


def _skip_without(body):
    for module in sorted(_imported(body) & set(OPTIONAL_MODULES)):
        if importlib.util.find_spec(module) is None:
            require_in_ci(module)
            pytest.skip(f"{module} is not importable")


# ---- the convention ------------------------------------------------------------------------------

def test_pages():
    assert {"README.md", "docs/api.md", "docs/serving.md", "docs/torch.md", "docs/quickstart-cpp.md"} <= set(PAGES)
    assert len(ALL) > 10


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in ALL])
def test_block_is_marked(block):
    assert block.kind is not None, (
        f"{block.name}: info string {' '.join(block.info)!r} is not in the convention of "
        "tests/python/doc_blocks.py (python, python cuda, python signature, cpp, sh, bash, console, text, ...)")
    if block.kind in ("script", "file"):  # README's sh lines must be on the page (test_quickstart.py)
        assert block.page in SCRIPT_PAGES or (block.page == "README.md" and block.kind == "script"), (
            f"{block.name}: sh blocks and project files run only on {SCRIPT_PAGES}")


@pytest.mark.parametrize("page", PAGES)
def test_no_code_in_indented_blocks(page):
    for line, body in indented_blocks(read_page(page)):
        assert not re.search(r"^\s*(import |from \w+ import |#include)|flash_kda(::|\.\w+\()", body, re.M), (
            f"{page}:{line}: an indented code block is never run; fence it with an info string")


def test_parser():
    text = ("x\n```python\nimport a\n```\n\n```python cuda\nb\n```\n```text schema\nc\n```\n```cpp\n"
            "// d/e.cpp\nint f;\n```\n```cpp\nint main() {}\n```\n```\nno info\n```\n```cmake\nx()\n```\n"
            "para\n\n    indented\n    more\n\n- item\n\n    list text\n")
    got = [(b.line, b.kind, b.body) for b in blocks(text)]
    assert got == [(2, "run", "import a\n"), (6, "run-cuda", "b\n"), (9, "schema", "c\n"),
                   (12, "file", "// d/e.cpp\nint f;\n"), (16, "program", "int main() {}\n"),
                   (19, None, "no info\n"), (22, None, "x()\n")]
    assert indented_blocks(text) == [(27, "    indented\n    more")]


def test_the_pages_hold_the_examples_they_promise():
    serving = [b.body for b in page_blocks("docs/serving.md") if b.kind == "run"]
    assert any("num_accepted_tokens=" in body and "flash_kda.decode(" in body for body in serving), (
        "docs/serving.md: no speculative-decoding example that runs")
    api = [b.body for b in page_blocks("docs/api.md") if b.kind in ("run", "signature")]
    assert any("flash_kda.reference(" in body for body in api), "docs/api.md: flash_kda.reference"


# ---- running the blocks --------------------------------------------------------------------------

@pytest.mark.parametrize("block", _params(("run", "run-cuda")))
def test_python_block_runs(block, tmp_path):
    if block.kind == "run-cuda" and not _cuda():
        pytest.skip("needs torch with a CUDA GPU and flash-kda's CUDA backend")
    _skip_without(block.body)
    r = run_python(block.body, tmp_path)
    assert r.returncode == 0, f"{block.name} failed:\n{(r.stdout + r.stderr)[-4000:]}"


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in ALL if b.kind in ("run", "run-cuda")])
def test_python_block_compiles(block):
    """Every Python block is valid Python, also where a cuda block cannot run."""
    compile(block.body, block.name, "exec")


def test_a_broken_block_fails(tmp_path):
    """The runner reports a snippet that is wrong: the speculative example of docs/serving.md with a
    misspelt keyword argument."""
    body = next(b.body for b in page_blocks("docs/serving.md") if b.kind == "run" and "num_accepted_tokens=" in b.body)
    r = run_python(body.replace("num_accepted_tokens=", "num_accepted="), tmp_path)
    assert r.returncode != 0 and "TypeError" in r.stderr and "num_accepted" in r.stderr, r.stderr[-2000:]


@pytest.fixture(scope="module")
def program_build(tmp_path_factory):
    """The C++ blocks as executables of one consumer project (flash-kda with the CPU backend alone)."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    folder = tmp_path_factory.mktemp("doc_programs")
    consumer_project(folder / "src", {_target(p.values[0]): p.values[0].body for p in _params(("program",))})
    r = cmake_configure(folder / "src", folder / "build", "-DCMAKE_BUILD_TYPE=Release")
    assert r.returncode == 0, r.stdout + r.stderr
    return folder / "build"


@pytest.mark.parametrize("block", _params(("program",)))
def test_cpp_block_runs(block, program_build):
    r = subprocess.run(["cmake", "--build", str(program_build), "--target", _target(block),
                        "--parallel", str(os.cpu_count() or 2)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{block.name} does not compile:\n{(r.stdout + r.stderr)[-4000:]}"
    r = subprocess.run([str(program_build / _target(block))], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{block.name} failed:\n{(r.stdout + r.stderr)[-4000:]}"


# ---- listings of the API -------------------------------------------------------------------------

def signature_mismatches(body):
    """The functions of a signature block that are shown otherwise than inspect.signature has them
    (None where the block lists none)."""
    listed = re.findall(r"(flash_kda(?:\.\w+)+)\(([^()]*)\)", re.sub(r"#[^\n]*", "", body))
    if not listed:
        return None
    wrong = []
    for name, args in listed:
        obj = importlib.import_module(name.split(".")[0])
        for attr in name.split(".")[1:]:
            obj = getattr(obj, attr)
        if " ".join(args.split()) != str(inspect.signature(obj))[1:-1]:
            wrong.append(f"{name}{inspect.signature(obj)}")
    return wrong


@pytest.mark.parametrize("block", _params(("signature",)))
def test_signature_block(block):
    assert signature_mismatches(block.body) == [], f"{block.name}: shown otherwise than inspect.signature has them"


def test_signature_check_can_fail():
    body = next(b.body for b in page_blocks("docs/api.md") if b.kind == "signature" and "decode(" in b.body)
    assert signature_mismatches(body.replace("num_accepted_tokens", "accepted")) == [
        "flash_kda.decode" + str(inspect.signature(importlib.import_module("flash_kda").decode))]


def _schema_text(s):
    return re.sub(r"\(\w+!\)", "(!)", " ".join(s.split()))  # alias sets (a!), (a6!) are names only


@pytest.mark.parametrize("block", _params(("schema",)))
def test_schema_block(block):
    _skip_without("import torch")
    import torch

    import flash_kda.torch_ops  # noqa: F401  (registers the operators)
    listed = re.findall(r"(flash_kda::(\w+)\(.*?\)\s*->\s*(?:\([^)]*\)|\w+))", block.body, re.S)
    operators = {"fwd", "fwd_checkpointed", "decode", "chunk_kda", "chunk_kda_checkpointed"}
    assert {name for _, name in listed} == operators, f"{block.name}: every operator the package registers"
    for text, name in listed:
        schema = str(getattr(torch.ops.flash_kda, name).default._schema)
        assert _schema_text(text) == _schema_text(schema), f"{block.name}: {name}\n{schema}"
