"""Benchmarks of flash-kda: ``python -m flash_kda.bench [speed|accuracy|e2e|all] [options]``.

- speed (default): the prefill cases and serving shapes of flash_kda.bench.cases on CUDA (a
  smaller suite on the CPU backend), or custom shapes (``--shape T=8192,H=48``,
  ``--shape lens=1300+547+1024x2,H=64``): median and spread of many calls, the floor (a copy of the
  same bytes, measured in the same run), fla's Triton ``chunk_kda`` on the same inputs when fla is
  importable, and FlashKDA when its extension ``flash_kda_C`` is (flash_kda.bench.speed,
  flash_kda.bench.flashkda).
- accuracy: relative error against the float64 recurrence across input distributions (normal,
  large |v|, strong decay, weak decay over a long sequence, many short sequences), for flash-kda
  and, on CUDA, fla (flash_kda.bench.accuracy).
- e2e: a stack of fla's KDA layers with random weights (Kimi-Linear-like and Kimi-K3-like with the
  safe gate, through fla's own dispatch; Kimi-Linear-like with its softplus gate, through
  flash_kda.chunk_kda in place of fla's chunk_kda), prefill with fla's Triton path and with
  flash-kda; f, s, Amdahl's prediction and the measured speedup (flash_kda.bench.e2e; CUDA and fla
  only).
- report: ``python -m flash_kda.bench report RESULTS.json [...] --md FILE --plots DIR`` rebuilds the
  markdown and plots from results files (how BENCHMARK_H200.md is made).

Every run writes OUT/bench.json (raw numbers: every timed call, flash-kda's version and commit as
built, device, versions), OUT/bench.md (the tables) and PNG plots (with matplotlib: ``pip install
matplotlib``), and prints a summary.
"""

from .cli import main

__all__ = ["main"]
