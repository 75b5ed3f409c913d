"""The C++ quick start runs as written: the code blocks of docs/quickstart-cpp.md, in order, in a
copy of the repository (configure, build, ctest, install into a scratch $HOME/.local, build and run
a consumer project and examples/ against the installed package with find_package(flash_kda)); the
README's C++ quick start shows commands of that page.

Blocks of the page: ```sh blocks run in one bash script (set -euo pipefail); a ```cmake or ```cpp
block whose first line is a comment naming a path (`# my_engine/CMakeLists.txt`) is written to that
path first. A block right after the line `<!-- not run -->` is left out (there is none today).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "quickstart-cpp.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
PATH_COMMENT = re.compile(r"^(?:#|//)\s*([\w./-]+\.(?:txt|cpp|h|cmake))\s*$")


def blocks(text):
    """(language, body, preceded by <!-- not run -->) of every fenced block of a markdown text."""
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
        out.append((m.group(1), m.group(2), before.strip() == "<!-- not run -->"))
    return out


def doc_script(text):
    """The page as (files to write {path: content}, the bash script of its sh blocks)."""
    files, script = {}, []
    for lang, body, skipped in blocks(text):
        if skipped:
            continue
        if lang == "sh":
            script.append(body)
        elif lang in ("cmake", "cpp"):
            m = PATH_COMMENT.match(body.split("\n", 1)[0])
            if m:
                files[m.group(1)] = body
    return files, "\n".join(script)


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
    # a skipped block is left out, a block without a path comment is not written
    files, script = doc_script("<!-- not run -->\n```sh\nexit 1\n```\n```cpp\nint x;\n```\n```sh\ntrue\n```\n")
    assert files == {} and script == "true\n"


def test_readme_shows_the_pages_commands():
    with open(DOC) as f:
        _, script = doc_script(f.read())
    doc_lines = {line.strip() for line in script.splitlines()}
    section = readme_cpp_section()
    assert "docs/quickstart-cpp.md" in section
    commands = [line.strip() for lang, body, _ in blocks(section) if lang == "sh" for line in body.splitlines()]
    assert commands, "the README's C++ quick start shows no commands"
    for line in commands:
        assert line in doc_lines, f"README command not on docs/quickstart-cpp.md (so not tested): {line}"


def _copy_of_the_repository(dest):
    """The files a fresh clone has (tracked, plus untracked ones git does not ignore)."""
    try:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"],
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot tell the repository's files from build outputs")
    for rel in filter(None, listed):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def test_quickstart_runs_as_written(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    with open(DOC) as f:
        files, script = doc_script(f.read())
    work, home = tmp_path / "flash-kda", tmp_path / "home"
    home.mkdir()
    _copy_of_the_repository(work)
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


def _configure(source, build, *defines):
    return subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-DFLASH_KDA_ENABLE_CUDA=OFF", *defines],
                          capture_output=True, text=True, timeout=300)


def test_inside_another_project_no_googletest_is_needed(tmp_path):
    """add_subdirectory(flash-kda) builds the library alone: tests, tools and examples default to
    OFF, so a consumer without GoogleTest configures."""
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    consumer = tmp_path / "engine"
    consumer.mkdir()
    (consumer / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.24)\nproject(engine LANGUAGES CXX)\n"
        f'add_subdirectory("{ROOT}" flash-kda)\n'
        "add_executable(engine main.cpp)\ntarget_link_libraries(engine PRIVATE flash_kda::flash_kda)\n")
    (consumer / "main.cpp").write_text("#include <flash_kda/flash_kda.h>\nint main() { return 0; }\n")
    r = _configure(consumer, tmp_path / "build", "-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON")
    assert r.returncode == 0, r.stdout + r.stderr
    cache = (tmp_path / "build" / "CMakeCache.txt").read_text()
    for option in ("FLASH_KDA_BUILD_TESTS", "FLASH_KDA_BUILD_TOOLS", "FLASH_KDA_BUILD_EXAMPLES"):
        assert re.search(rf"^{option}:BOOL=OFF$", cache, re.M), option


def test_missing_googletest_is_a_clear_error(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    r = _configure(ROOT, tmp_path / "build", "-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON")
    assert r.returncode != 0
    assert "GoogleTest was not found" in r.stderr and "-DFLASH_KDA_BUILD_TESTS=OFF" in r.stderr
    r = _configure(ROOT, tmp_path / "build2", "-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON", "-DFLASH_KDA_BUILD_TESTS=OFF")
    assert r.returncode == 0, r.stdout + r.stderr
