"""Versions held in memory per job; subscribers wait on a condition for a newer one."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class WeightVersion:
    job_id: str
    version: int
    blob: bytes
    sha256: str


class ChecksumMismatch(ValueError):
    pass


class VersionStore:
    def __init__(self, keep_versions: int = 4):
        self.keep_versions = keep_versions
        self._jobs: dict[str, OrderedDict[int, WeightVersion]] = {}
        self._cond = threading.Condition()
        self.subscribers: dict[str, int] = {}

    def put(self, job_id: str, version: int, blob: bytes, sha256: str) -> WeightVersion:
        actual = hashlib.sha256(blob).hexdigest()
        if sha256 and actual != sha256:
            raise ChecksumMismatch(f"sha256: got {actual}, publisher said {sha256}")
        entry = WeightVersion(job_id, version, blob, actual)
        with self._cond:
            versions = self._jobs.setdefault(job_id, OrderedDict())
            latest = next(reversed(versions), -1) if versions else -1
            if version <= latest:
                raise ValueError(f"version: {version} is not newer than the latest published {latest}")
            versions[version] = entry
            while len(versions) > self.keep_versions:
                versions.popitem(last=False)
            self._cond.notify_all()
        return entry

    def latest(self, job_id: str) -> WeightVersion | None:
        with self._cond:
            versions = self._jobs.get(job_id)
            return versions[next(reversed(versions))] if versions else None

    def get(self, job_id: str, version: int) -> WeightVersion | None:
        with self._cond:
            return self._jobs.get(job_id, {}).get(version)

    def wait_newer(self, job_id: str, have_version: int, timeout: float) -> WeightVersion | None:
        with self._cond:
            self._cond.wait_for(lambda: (v := self.latest(job_id)) is not None and v.version > have_version,
                                timeout=timeout)
            latest = self.latest(job_id)
            return latest if latest is not None and latest.version > have_version else None

    def drop_job(self, job_id: str) -> None:
        with self._cond:
            self._jobs.pop(job_id, None)
