"""The forecaster's durable state: one JSON line per validation point received, one file per job.

A line is `{"point": <ValidationPoint as JSON>, "recipe_json": "<the recipe sent with it, or empty>"}`, plus
`"eval_set": "<name>"` for a downstream eval set's point; replaying every file in order rebuilds each job's curves
and latest recipe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

from google.protobuf import json_format

from scalerl.v1 import common_pb2


class PointLog:
    """Append-only JSONL files under `state_dir`, one per job."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)

    def path_of(self, job_id: str) -> Path:
        # the job id is user input: never let it name a path outside state_dir
        return self.state_dir / f"{quote(job_id, safe='')}.jsonl"

    def append(self, point: common_pb2.ValidationPoint, recipe_json: str, eval_set: str = "iid") -> None:
        record = {"point": json_format.MessageToDict(point), "recipe_json": recipe_json}
        if eval_set != "iid":
            record["eval_set"] = eval_set
        line = json.dumps(record)
        with open(self.path_of(point.job_id), "a") as f:
            f.write(line + "\n")

    def replay(self) -> Iterator[tuple[common_pb2.ValidationPoint, str, str]]:
        """Every stored (point, recipe_json, eval_set), job by job, in the order they arrived."""
        for path in sorted(self.state_dir.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                record = json.loads(line)
                yield (json_format.ParseDict(record["point"], common_pb2.ValidationPoint()),
                       record.get("recipe_json", ""), record.get("eval_set", "iid"))
