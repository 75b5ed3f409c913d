"""`python -m flash_kda` runs, and the package leaves torch alone unless given torch tensors."""

from __future__ import annotations

import re
import subprocess
import sys


def _run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)


def test_main_command_prints_time_and_error():
    r = _run("-m", "flash_kda", "--seqlen", "256", "--heads", "2", "--repeat", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^flash-kda \S+ \| backend: (cpu|cuda)", r.stdout, re.M), r.stdout
    assert re.search(r"^time: median [0-9.]+ ms", r.stdout, re.M), r.stdout
    assert re.search(r"^throughput: [0-9,]+ tokens/s", r.stdout, re.M), r.stdout
    m = re.search(r"out rel ([0-9.e+-]+), final_state rel ([0-9.e+-]+) \[ok", r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) <= 4e-3 and float(m.group(2)) <= 3e-3


def test_main_command_reference_backend():
    r = _run("-m", "flash_kda", "--backend", "reference", "--seqlen", "40", "--heads", "1",
             "--repeat", "1", "--check-tokens", "40")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "backend: reference" in r.stdout


def test_main_command_rejects_bad_flags():
    r = _run("-m", "flash_kda", "--seqlen", "0")
    assert r.returncode == 2
    assert "--seqlen" in r.stderr


def test_numpy_calls_do_not_import_torch():
    code = (
        "import sys, numpy as np, ml_dtypes, flash_kda\n"
        "bf = ml_dtypes.bfloat16\n"
        "z = lambda *s: np.zeros(s, bf)\n"
        "flash_kda.fwd(z(1, 4, 1, 128), z(1, 4, 1, 128), z(1, 4, 1, 128), z(1, 4, 1, 128), z(1, 4, 1),\n"
        "              0.1, z(1, 4, 1, 128), np.zeros(1, np.float32), np.zeros(128, np.float32), -1.0)\n"
        "assert 'torch' not in sys.modules\n"
    )
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr
