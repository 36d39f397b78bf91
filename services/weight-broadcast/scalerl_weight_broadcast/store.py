"""Versions held in memory per job; subscribers wait on a condition for a newer one."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from scalerl import errors


@dataclass(frozen=True)
class WeightVersion:
    job_id: str
    version: int
    blob: bytes
    sha256: str
    frames: tuple = field(default=(), compare=False, repr=False)
    """Pre-serialized WeightChunk messages of the latest version (filled by the service, freed when a newer
    version arrives): every subscriber is sent the same bytes, nothing is re-serialized per subscriber."""


class ChecksumMismatch(errors.InvalidArgument):
    """The bytes do not hash to what the publisher claimed."""


class VersionStore:
    def __init__(self, keep_versions: int = 4, max_pinned: int = 16):
        self.keep_versions = keep_versions
        self.max_pinned = max_pinned
        self._jobs: dict[str, OrderedDict[int, WeightVersion]] = {}
        # Versions queued for validation: kept past the last `keep_versions` until fetched with release.
        self._pinned: dict[str, OrderedDict[int, WeightVersion]] = {}
        self._cond = threading.Condition()
        self.subscribers: dict[str, int] = {}

    def put(self, job_id: str, version: int, blob: bytes, sha256: str, *, actual_sha256: str | None = None,
            frames: tuple = (), pinned: bool = False) -> WeightVersion:
        """`actual_sha256`: the digest when the caller already hashed `blob` (e.g. while receiving it)."""
        actual = actual_sha256 or hashlib.sha256(blob).hexdigest()
        if sha256 and actual != sha256:
            raise ChecksumMismatch(f"got {actual}, publisher said {sha256}", field="sha256", job_id=job_id)
        entry = WeightVersion(job_id, version, blob, actual, tuple(frames))
        with self._cond:
            versions = self._jobs.setdefault(job_id, OrderedDict())
            latest = next(reversed(versions), -1) if versions else -1
            if version <= latest:
                if pinned:
                    # A version queued for validation published again (its pin was released by an evaluator
                    # that then died, or this service restarted): held as a pin only, never streamed.
                    pins = self._pinned.setdefault(job_id, OrderedDict())
                    pins[version] = entry
                    self._trim_pins(pins)
                    return entry
                raise errors.InvalidArgument(f"{version} is not newer than the latest published {latest}",
                                             field="version", job_id=job_id)
            if versions:
                # only the latest version is streamed (Fetch of older ones re-serializes): free the old frames;
                # a subscriber still sending them holds its own reference to the tuple
                object.__setattr__(versions[latest], "frames", ())
            versions[version] = entry
            while len(versions) > self.keep_versions:
                versions.popitem(last=False)
            if pinned:
                pins = self._pinned.setdefault(job_id, OrderedDict())
                pins[version] = entry
                self._trim_pins(pins)
            self._cond.notify_all()
        return entry

    def _trim_pins(self, pins: OrderedDict[int, WeightVersion]) -> None:
        while len(pins) > self.max_pinned:
            pins.popitem(last=False)

    def latest(self, job_id: str) -> WeightVersion | None:
        with self._cond:
            versions = self._jobs.get(job_id)
            return versions[next(reversed(versions))] if versions else None

    def get(self, job_id: str, version: int, release: bool = False) -> WeightVersion | None:
        with self._cond:
            pins = self._pinned.get(job_id, {})
            pinned = pins.pop(version, None) if release else pins.get(version)
            return pinned or self._jobs.get(job_id, {}).get(version)

    def require(self, job_id: str, version: int, release: bool = False) -> WeightVersion:
        """`get`, or NotFound naming the version."""
        entry = self.get(job_id, version, release=release)
        if entry is None:
            raise errors.NotFound(f"job {job_id!r} has no version {version} (kept: last {self.keep_versions})",
                                  field="version", job_id=job_id)
        return entry

    def wait_newer(self, job_id: str, have_version: int, timeout: float) -> WeightVersion | None:
        with self._cond:
            self._cond.wait_for(lambda: (v := self.latest(job_id)) is not None and v.version > have_version,
                                timeout=timeout)
            latest = self.latest(job_id)
            return latest if latest is not None and latest.version > have_version else None

    def drop_job(self, job_id: str) -> None:
        with self._cond:
            self._jobs.pop(job_id, None)
            self._pinned.pop(job_id, None)
