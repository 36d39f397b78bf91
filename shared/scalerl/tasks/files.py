"""`file`: the user's own prompts and answers from a JSONL or Parquet file on a volume every service that builds
prompts can read (api, replay-buffer, evaluator). Fields are mapped by the recipe (`task.dataset`): the prompt,
the reference answer, optionally a per-row verifier and a stable id. Graded by `math` (math-verify, `\\boxed{}`
answers) unless the recipe or a row says otherwise.

The validation split is held out by id: a row is validation when the hash of its id (the id field, else the
prompt text) falls below `validation_fraction`, so a row never changes side when the file grows or is reordered.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from scalerl.tasks.base import Split, Task, TaskPrompt, TaskSettings, find_verifier, register_task

FORMATS = ("jsonl", "parquet")


class DatasetSettings(Protocol):
    """What this task reads from the recipe's `task.dataset` (`scalerl.recipe.FileDatasetConfig`)."""

    path: str
    format: str
    prompt_field: str
    answer_field: str
    verifier_field: str | None
    id_field: str | None
    validation_fraction: float


def file_format(path: str, declared: str) -> str:
    if declared != "auto":
        return declared
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise ValueError(f"cannot tell the format of {path!r} from its suffix; set task.dataset.format "
                     f"({', '.join(FORMATS)})")


def check_readable(path: str) -> None:
    """Raises ValueError naming the problem when `path` is not a readable, non-empty file."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{path!r} does not exist (the file must be on a volume the services can read)")
    if not p.is_file():
        raise ValueError(f"{path!r} is not a file")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{path!r} is not readable")
    if p.stat().st_size == 0:
        raise ValueError(f"{path!r} is empty")


def _jsonl_rows(path: str) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no} is not JSON: {err.msg}") from err
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no} is not a JSON object")
            yield row


def _parquet_columns(path: str) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(path).names)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
        raise ValueError(f"{path!r} is not a Parquet file: {err}") from err


def read_rows(path: str, fmt: str) -> Iterator[dict]:
    if file_format(path, fmt) == "jsonl":
        yield from _jsonl_rows(path)
        return
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"{path!r} is not a Parquet file: {err}") from err
    yield from table.to_pylist()


def first_record_fields(path: str, fmt: str) -> set[str]:
    """The fields of the file's first record (JSONL) or its columns (Parquet); raises ValueError if it has none."""
    if file_format(path, fmt) == "parquet":
        columns = _parquet_columns(path)
        if not columns:
            raise ValueError(f"{path!r} has no columns")
        return set(columns)
    for row in _jsonl_rows(path):
        return set(row)
    raise ValueError(f"{path!r} has no records")


def is_validation_id(row_id: str, fraction: float) -> bool:
    digest = hashlib.sha256(row_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def _field(row: dict, name: str, line: int, what: str) -> str:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"task.dataset.{what}: record {line} has no {name!r}")
    return str(value)


def file_prompts(cfg: TaskSettings, split: Split, n: int, verifier: str) -> list[TaskPrompt]:
    """Up to `n` rows of `split` (`all`: every row, for a downstream file set), in file order, each graded by its
    own verifier field or `verifier`."""
    ds: DatasetSettings | None = getattr(cfg, "dataset", None)
    if ds is None:
        raise ValueError("task.dataset: the file task needs a dataset (path and field names)")
    check_readable(ds.path)
    want_validation = None if split == "all" else split == "validation"
    out: list[TaskPrompt] = []
    seen: set[str] = set()
    for i, row in enumerate(read_rows(ds.path, ds.format)):
        text = _field(row, ds.prompt_field, i, "prompt_field")
        answer = _field(row, ds.answer_field, i, "answer_field")
        row_id = _field(row, ds.id_field, i, "id_field") if ds.id_field else hashlib.sha256(
            text.encode()).hexdigest()[:16]
        if row_id in seen:
            if ds.id_field:
                raise ValueError(f"task.dataset.id_field: id {row_id!r} appears twice")
            continue  # the same prompt twice: once is enough
        seen.add(row_id)
        if want_validation is not None and is_validation_id(row_id, ds.validation_fraction) != want_validation:
            continue
        grade_as = verifier
        if ds.verifier_field and row.get(ds.verifier_field):
            grade_as = str(row[ds.verifier_field])
            if find_verifier(grade_as) is None:
                raise ValueError(f"task.dataset.verifier_field: record {i} names unknown verifier {grade_as!r}")
        out.append(TaskPrompt(f"{split}-{row_id}", text, answer, grade_as, {"row": i, "id": row_id}))
        if len(out) >= n:
            break
    if not out:
        raise ValueError(f"task.dataset.path: {ds.path!r} has no {split} records "
                         f"(validation_fraction {ds.validation_fraction})")
    return out


register_task(Task("file", file_prompts, verifiers=("math", "exact_numeric")))
