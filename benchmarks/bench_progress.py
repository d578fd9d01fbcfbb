"""Progress display: the fits/s rate shown after the first chunk, with and without
compilation counted, against the steady-state rate.

Problem: Gpufit's 2-D Gaussian (5x5 pixels, 5 parameters; ``adaptprec._demos.batch``),
``--fits`` fits solved ``--chunk`` at a time with a progress display. A recording display
timestamps every update and the ``compiling(on)`` notifications, and the script prints:

* the rate the first update would show if the clock started at ``progress(0, total)``
  (what the hand-written display before issue 17 showed: compilation included);
* the rate it shows now (the clock starts when compilation ends);
* the steady-state rate over the remaining chunks.

Run:  python benchmarks/bench_progress.py [--fits 100000 --chunk 20000]
"""

from __future__ import annotations

import argparse
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import adaptprec as ap  # noqa: E402
from adaptprec._demos.batch import make_problem  # noqa: E402


class Recorder:
    def __init__(self):
        self.calls, self.compile_end = [], None

    def __call__(self, done, total):
        self.calls.append((time.perf_counter(), done))

    def compiling(self, on):
        if not on:
            self.compile_end = time.perf_counter()


def main():
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--fits", type=int, default=100_000)
    ap_.add_argument("--chunk", type=int, default=20_000)
    args = ap_.parse_args()
    xy, data, _, x0 = make_problem(args.fits)

    def gauss(p, xy):
        a, cx, cy, w, b = p[0], p[1], p[2], p[3], p[4]
        return a * jax.numpy.exp(-((xy[0] - cx) ** 2 + (xy[1] - cy) ** 2) / (2 * w * w)) + b

    rec = Recorder()
    ap.solve_nlsq_batch(gauss, x0, (xy,), in_axes=None, ydata=data, chunk_size=args.chunk,
                        progress=rec)
    (t0, _), (t1, n1) = rec.calls[0], rec.calls[1]
    tl, nl = rec.calls[-1]
    print(f"{args.fits} fits in chunks of {args.chunk}; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"compilation (ahead of the first chunk): {rec.compile_end - t0:.2f} s")
    print(f"first update, clock from progress(0) (old display): {n1 / (t1 - t0):,.0f} fits/s")
    print(f"first update, clock from end of compilation (now):  "
          f"{n1 / (t1 - rec.compile_end):,.0f} fits/s")
    print(f"steady state over the remaining chunks:             "
          f"{(nl - n1) / (tl - t1):,.0f} fits/s")


if __name__ == "__main__":
    main()
