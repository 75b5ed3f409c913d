#!/usr/bin/env bash
# The test command of the README and of CI. On a fresh machine it installs what the tests need
# (GoogleTest from Debian when run as root, Python packages from PyPI, torch included), then:
#   1. configures and builds the C++ library, the CUDA kernels for sm_90a (compile only where no
#      GPU is present), the GoogleTest suite (the GPU tests of tests/gpu included), the C++
#      benchmark (bench/cpp) and examples/; runs ctest (the example program included);
#   2. rebuilds the CPU code, tests and examples with ASan/UBSan and runs ctest again;
#   3. installs the Python package (pip install .) and runs pytest; its test_quickstart.py runs
#      docs/quickstart-cpp.md as written in a copy of the repository: configure, build, ctest,
#      cmake --install, then a consumer project and examples/ built against the installed package
#      with find_package(flash_kda), and run.
# GPU tests (ctest label gpu: tests/gpu; scripts/gpu_check.sh) need an H200: without a CUDA device
# ctest reports them skipped (exit 77).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)

if [[ ! -e /usr/include/gtest/gtest.h && $(id -u) == 0 ]]; then
  apt-get update -qq && apt-get install -y -qq libgtest-dev cmake g++ ninja-build >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check numpy ml_dtypes nanobind scikit-build-core pytest ninja
# torch, for the PyTorch tests. Only PyPI is assumed reachable, whose Linux x86-64 torch wheel is the
# CUDA build: it runs on the CPU too, and installs in ~2-3 minutes (~5 GB with its nvidia-*
# dependencies). FLASH_KDA_TORCH_INDEX_URL picks another index (e.g. the much smaller CPU-only
# build); FLASH_KDA_SKIP_TORCH=1 skips it on purpose. A failed install fails the run: the PyTorch
# tests must not be skipped silently. fla (flash-linear-attention) and matplotlib make the CPU
# dispatch test and the plot tests run.
if [[ ${FLASH_KDA_SKIP_TORCH:-0} != 1 ]]; then
  if ! python3 -c "import torch" 2>/dev/null; then
    echo "== installing torch (PyTorch tests)"
    python3 -m pip install -q --disable-pip-version-check ${FLASH_KDA_TORCH_INDEX_URL:+--index-url "$FLASH_KDA_TORCH_INDEX_URL"} "torch>=2.4"
  fi
  python3 -m pip install -q --disable-pip-version-check flash-linear-attention matplotlib
fi

echo "== C++ build (CUDA kernels included when nvcc is found) and ctest"
cmake -S . -B build/test -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/test -j"$JOBS"
ctest --test-dir build/test --output-on-failure -j"$JOBS"

echo "== CPU code and tests under ASan/UBSan"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASH_KDA_ENABLE_CUDA=OFF \
  -DFLASH_KDA_SANITIZE=ON >/dev/null
cmake --build build/asan -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build/asan --output-on-failure -j"$JOBS"

echo "== Python package and pytest"
python3 -m pip install -q --disable-pip-version-check .
python3 -m pytest tests/python -q
