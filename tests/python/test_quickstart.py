"""The C++ quick start runs as written: the code blocks of docs/quickstart-cpp.md, in order, in a
copy of the repository (configure, build, ctest, install into a scratch $HOME/.local, build and run
a consumer project and examples/ against the installed package with find_package(flash_kda)); the
README's C++ quick start shows commands of that page.

The page's ```sh blocks run in one bash script (set -euo pipefail); a ```cmake or ```cpp block whose
first line is a comment naming a path (`# my_engine/CMakeLists.txt`) is written to that path first.
The convention of info strings, and the parser, are those of every page: tests/python/doc_blocks.py
(tests/python/test_docs_examples.py checks and runs the other blocks).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from doc_blocks import ROOT, blocks, cmake_configure, consumer_project, copy_of_the_repository, doc_script

DOC = os.path.join(ROOT, "docs", "quickstart-cpp.md")


def readme_cpp_section():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    m = re.search(r"^## C\+\+ quick start\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "README.md has no '## C++ quick start' section"
    return m.group(1)


def test_parser_reads_the_page():
    with open(DOC) as f:
        files, script = doc_script(f.read())
    assert set(files) == {"my_engine/CMakeLists.txt", "my_engine/main.cpp"}
    assert "find_package(flash_kda" in files["my_engine/CMakeLists.txt"]
    for command in ("cmake -S . -B build/release", "ctest --test-dir build/release", "cmake --install",
                    "cmake -S examples", "./build/example/kda_forward", "./my_engine/build/my_engine"):
        assert command in script, command
    # a shown block is left out, a C++ block without a path comment is not a file of the project
    files, script = doc_script("```bash\nexit 1\n```\n```cpp\nint x;\n```\n```sh\ntrue\n```\n")
    assert files == {} and script == "true\n"


def test_readme_shows_the_pages_commands():
    with open(DOC) as f:
        _, script = doc_script(f.read())
    doc_lines = {line.strip() for line in script.splitlines()}
    section = readme_cpp_section()
    assert "docs/quickstart-cpp.md" in section
    commands = [line.strip() for b in blocks(section) if b.kind == "script" for line in b.body.splitlines()]
    assert commands, "the README's C++ quick start shows no commands"
    for line in commands:
        assert line in doc_lines, f"README command not on docs/quickstart-cpp.md (so not tested): {line}"


def test_quickstart_runs_as_written(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    with open(DOC) as f:
        files, script = doc_script(f.read())
    work, home = tmp_path / "flash-kda", tmp_path / "home"
    home.mkdir()
    if not copy_of_the_repository(work):
        pytest.skip("not a git checkout: cannot tell the repository's files from build outputs")
    for rel, body in files.items():
        os.makedirs(work / os.path.dirname(rel), exist_ok=True)
        (work / rel).write_text(body)
    env = dict(os.environ, HOME=str(home))
    r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=work, env=env, capture_output=True,
                       text=True, timeout=1500)
    log = (r.stdout + r.stderr)[-6000:]
    assert r.returncode == 0, log
    assert "100% tests passed" in r.stdout, log  # flash-kda's ctest
    assert re.search(r"out\[0, 0, 0, 0\] = -?\d+\.\d{4}", r.stdout), log  # my_engine ran
    assert "relative error against float64" in r.stdout and ": ok" in r.stdout, log  # kda_forward ran
    installed = home / ".local"
    assert (installed / "include" / "flash_kda" / "bf16.h").exists()
    assert list(installed.glob("lib*/cmake/flash_kda/flash_kdaConfig.cmake"))


def test_inside_another_project_no_googletest_is_needed(tmp_path):
    """add_subdirectory(flash-kda) builds the library alone: tests, the benchmark and examples default to
    OFF, so a consumer without GoogleTest configures."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    consumer = tmp_path / "engine"
    consumer_project(consumer, {"engine": "#include <flash_kda/flash_kda.h>\nint main() { return 0; }\n"})
    r = cmake_configure(consumer, tmp_path / "build", "-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON")
    assert r.returncode == 0, r.stdout + r.stderr
    cache = (tmp_path / "build" / "CMakeCache.txt").read_text()
    for option in ("FLASH_KDA_BUILD_TESTS", "FLASH_KDA_BUILD_BENCH", "FLASH_KDA_BUILD_EXAMPLES"):
        assert re.search(rf"^{option}:BOOL=OFF$", cache, re.M), option


def test_missing_googletest_is_a_clear_error(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    r = cmake_configure(ROOT, tmp_path / "build", "-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON")
    assert r.returncode != 0
    assert "GoogleTest was not found" in r.stderr and "-DFLASH_KDA_BUILD_TESTS=OFF" in r.stderr
    r = cmake_configure(ROOT, tmp_path / "build2", "-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON", "-DFLASH_KDA_BUILD_TESTS=OFF")
    assert r.returncode == 0, r.stdout + r.stderr
