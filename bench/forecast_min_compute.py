#!/usr/bin/env python
"""The demo's fit with its window starting past the early jump (`forecast.min_compute` > 0), against the recipe's 0.

The paper leaves the first stretch of compute out of its fits.  For every `make run` recorded since the tiny model
and budget of today's demo (docs/benchmarks/runs/session17 onwards, `make-run*.csv`: the runs at 0.23 device-hours
and four of the same recipe at twice that), this refits the whole run and its first half with the window starting
at a share of the run's last compute (the same compute for both fits, as one recipe setting would give), and counts:
whole runs called identifiable; first halves called identifiable, holding the final value (mean of the last 3
evaluations) in their 80 % interval, off by more than 0.03, and of those, called identifiable.

Usage: python bench/forecast_min_compute.py [--shares 0,0.05,0.1,0.15] [-v]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

import forecast_bench as fb  # noqa: E402
from scalerl_forecaster.csvio import read_curve  # noqa: E402
from scalerl_forecaster.fit import fit_curve, halfway_check  # noqa: E402

FIRST_SESSION = 17


def runs():
    for path in sorted(fb.RUNS_DIR.glob("session*/make-run*.csv")):
        if int(path.parent.name.removeprefix("session")) >= FIRST_SESSION:
            yield str(path.relative_to(fb.RUNS_DIR)), *(np.array(a) for a in read_curve(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shares", default="0,0.05,0.1,0.15", help="window starts, as shares of each run's last compute")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per run and share")
    args = ap.parse_args(argv)
    shares = [float(s) for s in args.shares.split(",")]
    counts = {s: dict(whole=0, half=0, covered=0, off=0, off_ident=0) for s in shares}
    n = 0
    for name, c, v in runs():
        n += 1
        for share in shares:
            start = share * c[-1]
            whole = fit_curve(c, v, min_compute=start)
            check = halfway_check(c, v, min_compute=start)  # what `make run` prints, with this window start
            half, p, err = check.fit, check.predicted, check.error
            k = counts[share]
            k["whole"] += whole.identifiable
            k["half"] += half.identifiable
            k["covered"] += p.interval[0] <= check.final <= p.interval[1]
            k["off"] += abs(err) > 0.03
            k["off_ident"] += half.identifiable and abs(err) > 0.03
            if args.verbose:
                lo, hi = whole.intervals["A"]
                print(f"{name:60s} {share:.2f}: whole {'ident.' if whole.identifiable else 'not   '} A width "
                      f"{hi - lo:.3f}; first half {'ident.' if half.identifiable else 'not   '} {err:+.3f}")
    print(f"{n} runs (docs/benchmarks/runs/session{FIRST_SESSION}+ make-run*.csv)\n")
    print("| min_compute (share of the run) | whole run identifiable | first half identifiable | first half covered "
          "| first half off by > 0.03 | of those, identifiable |")
    print("|---|---|---|---|---|---|")
    for share, k in counts.items():
        print(f"| {share:g} | {k['whole']} | {k['half']} | {k['covered']} | {k['off']} | {k['off_ident']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
