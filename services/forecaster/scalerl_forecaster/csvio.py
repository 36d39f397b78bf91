"""Reading curve CSV files: header ``compute,value``, one point per row, first row at compute 0."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .fit import CurveError

__all__ = ["read_curve", "parse_curve", "write_curve"]


def parse_curve(text: str, source: str = "<csv>") -> tuple[list[float], list[float]]:
    """Parse CSV text into (compute, values). Raises CurveError with a clear message on bad input."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(cell.strip() for cell in r)]
    if not rows:
        raise CurveError(f"{source}: empty file (expected a header 'compute,value' and data rows)")
    header = [h.strip().lower() for h in rows[0]]
    if "compute" not in header or "value" not in header:
        raise CurveError(f"{source}: missing header 'compute,value' (first row is {','.join(rows[0])!r})")
    ic, iv = header.index("compute"), header.index("value")
    data = rows[1:]
    if not data:
        raise CurveError(f"{source}: no data rows after the header")
    compute, values = [], []
    for n, row in enumerate(data, start=2):
        try:
            compute.append(float(row[ic]))
            values.append(float(row[iv]))
        except (IndexError, ValueError):
            raise CurveError(f"{source}: line {n}: expected two numbers, got {','.join(row)!r}") from None
    return compute, values


def read_curve(path: str | Path) -> tuple[list[float], list[float]]:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise CurveError(f"{p}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise CurveError(f"{p}: cannot read: {e}") from None
    return parse_curve(text, str(p))


def write_curve(path: str | Path, compute, values) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["compute", "value"])
        for c, v in zip(compute, values):
            w.writerow([repr(float(c)), repr(float(v))])
