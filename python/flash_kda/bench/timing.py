"""Timers (CUDA events on a GPU, time.perf_counter on the host), summary statistics and a progress
bar (tqdm when importable, else a small built-in one)."""

from __future__ import annotations

import statistics
import sys
import time


def summarize(times_ms):
    """Median and spread of a list of times in ms (all raw times kept, rounded to 0.1 us)."""
    s = sorted(times_ms)
    n = len(s)

    def quantile(p):  # linear interpolation, as numpy's default
        x = p * (n - 1)
        i = int(x)
        return s[i] if i + 1 >= n else s[i] + (s[i + 1] - s[i]) * (x - i)

    med = statistics.median(s)
    return dict(
        median_ms=med, min_ms=s[0], max_ms=s[-1], p10_ms=quantile(0.1), p90_ms=quantile(0.9),
        spread=(quantile(0.9) - quantile(0.1)) / med if med > 0 else 0.0,  # (p90 - p10) / median
        reps=n, times_ms=[round(t, 4) for t in times_ms],
    )


def time_host(fn, reps, warmup=1):
    """Host timing: warm-up calls, then `reps` calls each timed with time.perf_counter (ms)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def time_cuda(torch, fn, reps, warmup=5):
    """CUDA timing: warm-up, then `reps` calls, each between two CUDA events on the
    current stream and synchronised before the next (ms)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


class _SimpleBar:
    """A minimal progress bar on stderr: redrawn in place on a terminal, one line per step in a log."""

    def __init__(self, total, desc, disable):
        self.total, self.desc, self.n, self.disable = total, desc, 0, disable
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.postfix = ""
        self._draw()

    def _draw(self, final=False):
        if self.disable:
            return
        width = 24
        done = int(width * self.n / self.total) if self.total else width
        bar = "#" * done + "-" * (width - done)
        text = (f"{self.desc} [{bar}] {self.n}/{self.total} {time.perf_counter() - self.t0:6.1f}s"
                f"{' ' + self.postfix if self.postfix else ''}")
        if self.tty:
            sys.stderr.write("\r" + text.ljust(100) + ("\n" if final else ""))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def set_postfix_str(self, text):
        self.postfix = text
        if self.tty:
            self._draw()

    def update(self, n=1):
        self.n += n
        self._draw(final=self.n >= self.total)

    def write(self, text):
        if self.tty and not self.disable:
            sys.stderr.write("\r" + " " * 100 + "\r")
        print(text, flush=True)
        if self.tty and not self.disable and self.n < self.total:
            self._draw()

    def close(self):
        if self.tty and not self.disable and self.n < self.total:
            sys.stderr.write("\n")


class Progress:
    """Progress over `total` steps: tqdm when importable (and enabled), else _SimpleBar.
    `write` prints a line without breaking the bar."""

    def __init__(self, total, desc, enabled=True):
        self._tqdm = None
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if tqdm is not None:
            self._tqdm = tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr,
                              dynamic_ncols=True, leave=True)
            self._bar = self._tqdm
        else:
            self._bar = _SimpleBar(total, desc, disable=not enabled)

    def step(self, text):
        """Says what is being done now."""
        self._bar.set_postfix_str(text)

    def update(self, n=1):
        self._bar.update(n)

    def write(self, text):
        if self._tqdm is not None:
            self._tqdm.write(text)
            sys.stdout.flush()
        else:
            self._bar.write(text)

    def close(self):
        self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
