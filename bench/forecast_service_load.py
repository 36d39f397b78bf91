#!/usr/bin/env python
"""The live forecaster while a long curve is being fed: do reads, other jobs and bursts of points wait for its fits?

A GPU run validated every few steps gives its curve thousands of points, and a fit of 1000-3000 points takes
about 1-2 s (`bench/forecast_window_length.py`). The service (`scalerl_forecaster.jobs.Forecasts`, in process,
with its point log) holds a "gpu-run" curve of --points evaluations (replayed from the log, as after a restart)
and a "small-run" curve of 20. Then, at once:
- a learner adds --feed points to gpu-run, each waiting for its fit, as the learner's AddPoint does;
- another learner adds a point to small-run every 0.2 s;
- a reader (GetForecast, as the API and `scalerl status` do) reads both forecasts every 50 ms.
Then a burst: --burst points reach gpu-run at once (its iid split and eval sets of one version, or a learner
catching up after a restart), each caller waiting for a fit that covers its point.

Reported: the latency of each kind of call (median / p99 / max), the burst's wall time and how many fits it
took, and the series the forecaster exports for gpu-run.

Usage: python bench/forecast_service_load.py [--points 1000] [--feed 4] [--burst 8]
An older checkout, side by side: PYTHONPATH=<checkout>/services/forecaster python bench/forecast_service_load.py
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402

from scalerl.v1 import common_pb2  # noqa: E402
from scalerl_forecaster import jobs  # noqa: E402
from scalerl_forecaster.fit import sigmoid_curve  # noqa: E402
from scalerl_forecaster.store import PointLog  # noqa: E402

W = 8000.0
LONG, SHORT = "gpu-run", "small-run"


def value(c: float, rng: np.random.Generator) -> float:
    return float(np.clip(sigmoid_curve(np.array([c]), 0.7, 1.8, W / 2, 0.25)[0] + rng.normal(0, 0.01), 0, 1))


def point(job: str, version: int, compute: float, rng) -> common_pb2.ValidationPoint:
    return common_pb2.ValidationPoint(job_id=job, step=version, policy_version=version, compute=compute,
                                      value=value(compute, rng))


def stats(ms: list[float]) -> str:
    if not ms:
        return "none"
    a = np.array(ms)
    return f"{np.median(a):7.1f} / {np.percentile(a, 99):7.1f} / {a.max():7.1f} ms  (n={a.size})"


class Counting:
    """Counts the fits: wraps the fit the service calls."""

    def __init__(self):
        self.real, self.calls, self.lock = jobs.fit_curve, 0, threading.Lock()
        jobs.fit_curve = self

    def __call__(self, *args, **kwargs):
        with self.lock:
            self.calls += 1
        return self.real(*args, **kwargs)


def exported_series(job: str) -> int:
    return sum(1 for fam in REGISTRY.collect() if fam.name.startswith("scalerl_forecaster_")
               for s in fam.samples if s.labels.get("job_id") == job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=1000, help="evaluations already on gpu-run's curve")
    ap.add_argument("--feed", type=int, default=4, help="points added to gpu-run one after another")
    ap.add_argument("--burst", type=int, default=8, help="points reaching gpu-run at once")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    step = W / args.points

    with tempfile.TemporaryDirectory() as state:
        log = PointLog(Path(state))
        for v in range(args.points + 1):
            log.append(point(LONG, v, v * step, rng), "")
        for v in range(20):
            log.append(point(SHORT, v, v * 100.0, rng), "")
        t0 = time.perf_counter()
        forecasts = jobs.Forecasts(state_dir=Path(state))
        print(f"gpu-run: {args.points + 1} points; the restart's replay and fits took {time.perf_counter() - t0:.2f} s")
        fits = Counting()

        reads: list[float] = []
        small_adds: list[float] = []
        long_adds: list[float] = []
        feeding = threading.Event()
        feeding.set()

        def reader():
            while feeding.is_set():
                for job in (LONG, SHORT):
                    t = time.perf_counter()
                    forecasts.forecast(job)
                    reads.append(1e3 * (time.perf_counter() - t))
                time.sleep(0.05)

        def small_learner():
            v = 20
            while feeding.is_set():
                t = time.perf_counter()
                forecasts.add_point(point(SHORT, v, v * 100.0, rng))
                small_adds.append(1e3 * (time.perf_counter() - t))
                v += 1
                time.sleep(0.2)

        threads = [threading.Thread(target=reader), threading.Thread(target=small_learner)]
        for t in threads:
            t.start()
        for k in range(args.feed):
            v = args.points + 1 + k
            t = time.perf_counter()
            forecasts.add_point(point(LONG, v, v * step, rng))
            long_adds.append(1e3 * (time.perf_counter() - t))
        feeding.clear()
        for t in threads:
            t.join()

        base = args.points + 1 + args.feed
        burst_fits = fits.calls
        done: list[float] = []
        start = threading.Barrier(args.burst + 1)

        def burst_point(v):
            start.wait()
            forecasts.add_point(point(LONG, v, v * step, rng))
            done.append(time.perf_counter())

        burst = [threading.Thread(target=burst_point, args=(base + i,)) for i in range(args.burst)]
        for t in burst:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in burst:
            t.join()
        burst_s = max(done) - t0
        burst_fits = fits.calls - burst_fits

        print(f"gpu-run AddPoint, each waiting for its fit      median / p99 / max: {stats(long_adds)}")
        print(f"GetForecast (both jobs, every 50 ms) meanwhile   median / p99 / max: {stats(reads)}")
        print(f"small-run AddPoint (every 0.2 s) meanwhile       median / p99 / max: {stats(small_adds)}")
        print(f"burst of {args.burst} points to gpu-run: all answered in {burst_s:.2f} s, {burst_fits} fits; "
              f"its curve has {forecasts.forecast(LONG).num_points} points")
        print(f"series exported for gpu-run: {exported_series(LONG)}")


if __name__ == "__main__":
    main()
