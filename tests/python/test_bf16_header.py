"""include/flash_kda/bf16.h, the public host bf16 helpers, against ml_dtypes' bfloat16 (round to
nearest even): a small C++ program converts a set of floats (ties, neighbours of ties, subnormals,
the largest finite values, infinities, NaNs, random bits) and the results must match bit for bit.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = r"""
#include <flash_kda/bf16.h>
#include <cstdio>
#include <cstring>
#include <vector>

// Reads float bit patterns (hex) from stdin; prints from_float's bf16 bits and to_float's float
// bits of every one, the vector forms checked against the scalar ones.
int main() {
  std::vector<float> in;
  unsigned bits;
  while (std::scanf("%x", &bits) == 1) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    in.push_back(f);
  }
  std::vector<uint16_t> h = flash_kda::bf16::from_float(in);
  std::vector<float> back = flash_kda::bf16::to_float(h);
  for (size_t i = 0; i < in.size(); ++i) {
    if (h[i] != flash_kda::bf16::from_float(in[i])) return 3;
    float f = flash_kda::bf16::to_float(h[i]);
    if (std::memcmp(&f, &back[i], sizeof f) != 0) return 4;
    unsigned out;
    std::memcpy(&out, &f, sizeof out);
    std::printf("%04x %08x\n", h[i], out);
  }
  return 0;
}
"""


def _inputs():
    rng = np.random.default_rng(7)
    special = np.array([0x00000000, 0x80000000, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001,
                        0x00000001, 0x00400000, 0x007fffff, 0x00008000, 0x00018000, 0x7f7fffff, 0xff7fffff,
                        0x7f7f7fff, 0x7f7f8000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffbfffff],
                       dtype=np.uint32)
    return np.concatenate([special, rng.integers(0, 2 ** 32, 20000, dtype=np.uint32)])


def test_bf16_header_rounds_like_ml_dtypes(tmp_path):
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src, exe = tmp_path / "bf16_check.cpp", tmp_path / "bf16_check"
    src.write_text(PROGRAM)
    subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", f"-I{ROOT}/include", str(src),
                    "-o", str(exe)], check=True)
    bits = _inputs()
    r = subprocess.run([str(exe)], input="\n".join(f"{b:08x}" for b in bits), capture_output=True, text=True,
                       check=True)
    got = np.array([[int(w, 16) for w in line.split()] for line in r.stdout.split("\n") if line], dtype=np.uint32)
    assert got.shape == (bits.size, 2)
    floats = bits.view(np.float32)
    nan = np.isnan(floats)
    expected = floats[~nan].astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.uint32)
    assert np.array_equal(got[~nan, 0], expected)
    # a NaN stays a NaN (quiet, sign kept); ml_dtypes' payload may differ
    assert np.all((got[nan, 0] & 0x7f80) == 0x7f80) and np.all(got[nan, 0] & 0x0040)
    assert np.array_equal(got[nan, 0] & 0x8000, (bits[nan] >> 16) & 0x8000)
    # to_float is exact: the bf16 bits in the upper half, zeros below
    assert np.array_equal(got[:, 1], got[:, 0] << 16)
