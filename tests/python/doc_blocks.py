"""The code blocks of the repository's Markdown (README.md and docs/*.md) and what the tests do with
each: the one parser and the one marker convention of tests/python/test_docs_examples.py (every page)
and tests/python/test_quickstart.py (the page docs/quickstart-cpp.md as one script).

The marker is the info string of a fenced block: a language, then optional words.

| info string | what the tests do with the block |
|---|---|
| `python` | runs alone in a fresh interpreter, in an empty temporary folder; must exit 0. Skipped where a module it imports (torch, fla) is missing, except in CI (CI=true), where that fails. |
| `python cuda` | the same, only where torch sees a CUDA GPU and `flash_kda.cuda_available()`; skipped elsewhere |
| `python signature` | not run: every `flash_kda.NAME(...)` in it must be `inspect.signature` of that function |
| `text schema` | not run: every `flash_kda::NAME(...) -> ...` in it must be the schema of `torch.ops.flash_kda.NAME` |
| `cpp` | a complete program: compiled against flash-kda (a CPU-only build) and run; must exit 0 |
| `cpp`, `cmake` with a path comment | a first line `// my_engine/main.cpp` or `# my_engine/CMakeLists.txt` makes the block a file of its page's project, written to that path before the page's `sh` blocks run |
| `sh` | commands that run: the `sh` blocks of a page in SCRIPT_PAGES, in order, as one bash script (set -euo pipefail) from the root of a copy of the repository; on another page they must be lines of such a page |
| `bash`, `console`, `text` | shown, not run: commands that install or need a GPU, output, formulas |

Any other info string, and a fence without one, is an error of the page. Indented code blocks are not
run (they carry no info string), so they must hold no Python or C++.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
SCRIPT_PAGES = ["docs/quickstart-cpp.md"]  # pages whose sh blocks run (tests/python/test_quickstart.py)

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
PATH_COMMENT = re.compile(r"^(?:#|//)\s*([\w./-]+\.(?:txt|cpp|h|cmake))\s*$")
KINDS = {
    ("python",): "run",
    ("python", "cuda"): "run-cuda",
    ("python", "signature"): "signature",
    ("text", "schema"): "schema",
    ("cpp",): "program",  # or "file", with a path comment
    ("cmake",): "file",
    ("sh",): "script",
    ("bash",): "shown",
    ("console",): "shown",
    ("text",): "shown",
}


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    info: tuple  # the words of the info string
    body: str

    @property
    def name(self):
        return f"{self.page}:{self.line}"

    @property
    def path(self):
        """The path a file block names in its first line, else None."""
        m = PATH_COMMENT.match(self.body.split("\n", 1)[0])
        return m.group(1) if m else None

    @property
    def kind(self):
        """run, run-cuda, signature, schema, program, file, script or shown; None for an info string
        outside the convention (and for a cmake block without a path)."""
        kind = KINDS.get(self.info)
        if kind in ("program", "file"):
            return "file" if self.path else ("program" if kind == "program" else None)
        return kind


def blocks(text, page="<text>"):
    """Every fenced block of a Markdown text, in order."""
    return [Block(page, text.count("\n", 0, m.start()) + 1, tuple(m.group(1).split()), m.group(2))
            for m in FENCE.finditer(text)]


def read_page(page):
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def page_blocks(page):
    return blocks(read_page(page), page)


def indented_blocks(text):
    """(line, body) of the indented code blocks outside fences: lines indented by four spaces or more
    after a blank line, with no list item open above them."""
    fenced = set()
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start())
        fenced.update(range(first, first + m.group(0).count("\n") + 1))
    lines, out, current, in_list = text.split("\n"), [], None, False
    for i, line in enumerate(lines):
        if i in fenced:
            current = None
            continue
        if re.match(r"^\s*([-*+]|\d+\.)\s", line):
            in_list = True
        elif not line.strip():
            pass
        elif not line.startswith(" "):
            in_list = False
        if current is not None and (line.startswith("    ") or not line.strip()):
            current[1].append(line)
        elif line.startswith("    ") and not in_list and i > 0 and not lines[i - 1].strip():
            current = (i + 1, [line])
            out.append(current)
        else:
            current = None
    return [(n, "\n".join(body).rstrip()) for n, body in out]


def doc_script(text):
    """A script page as (files to write {path: content}, the bash script of its sh blocks)."""
    files, script = {}, []
    for b in blocks(text):
        if b.kind == "script":
            script.append(b.body)
        elif b.kind == "file":
            files[b.path] = b.body
    return files, "\n".join(script)


def copy_of_the_repository(dest):
    """The files a fresh clone has (tracked, plus untracked ones git does not ignore); False outside a
    git checkout (where build outputs cannot be told from the repository's files)."""
    try:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"],
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return False
    for rel in filter(None, listed):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return True


def consumer_project(directory, programs):
    """A CMake project in `directory` that builds flash-kda with add_subdirectory (the library alone)
    and one executable per entry of `programs` ({target name: C++ source}) linked to
    flash_kda::flash_kda."""
    os.makedirs(directory, exist_ok=True)
    lines = ["cmake_minimum_required(VERSION 3.24)", "project(consumer LANGUAGES CXX)",
             f'add_subdirectory("{ROOT}" flash-kda)']
    for target, source in programs.items():
        with open(os.path.join(directory, f"{target}.cpp"), "w") as f:
            f.write(source)
        lines += [f"add_executable({target} {target}.cpp)",
                  f"target_link_libraries({target} PRIVATE flash_kda::flash_kda)"]
    with open(os.path.join(directory, "CMakeLists.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def cmake_configure(source, build, *defines):
    """cmake -S source -B build for the CPU backend alone (Ninja when it is installed)."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    return subprocess.run(["cmake", "-S", str(source), "-B", str(build), *generator,
                           "-DFLASH_KDA_ENABLE_CUDA=OFF", *defines], capture_output=True, text=True, timeout=300)
