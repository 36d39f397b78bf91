"""Weights through a shared volume: the learner writes one safetensors file per version, generators poll for a
newer one and hand its path to vLLM's workers, which read it themselves. No service in between."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from scalerl import errors
from scalerl.weights.base import FilesystemWeightTransportConfig, NamedTensors, StagedVersion, WeightTransport
from scalerl.weights.codec import SafetensorsBlob, SafetensorsFile, StagingBuffers

_VERSION_FILE = re.compile(r"^v(\d+)\.safetensors$")


class FilesystemTransport(WeightTransport):
    def __init__(self, root: str | Path, *, keep_versions: int = 4, poll_s: float = 0.5):
        self.root = Path(root)
        self.keep_versions = keep_versions
        self.poll_s = poll_s
        self._staging = StagingBuffers(count=1)  # a version is staged once the one before is written

    @classmethod
    def from_config(cls, config: FilesystemWeightTransportConfig) -> "FilesystemTransport":
        return cls(config.root, keep_versions=config.keep_versions, poll_s=config.poll_s)

    def _job_dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise errors.InvalidArgument(f"{job_id!r} is not usable as a directory name", field="job_id")
        return self.root / job_id

    @staticmethod
    def _path(job_dir: Path, version: int) -> Path:
        return job_dir / f"v{version}.safetensors"

    def _versions(self, job_dir: Path) -> list[int]:
        try:
            names = os.listdir(job_dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for name in names if (m := _VERSION_FILE.match(name)))

    def stage(self, job_id: str, version: int, tensors: NamedTensors, pinned: bool = False) -> StagedVersion:
        job_dir = self._job_dir(job_id)
        blob, release = self._staging.lease(tensors)
        return StagedVersion(lambda: self._write(job_dir, version, blob, pinned), release=release)

    def _write(self, job_dir: Path, version: int, blob: memoryview, pinned: bool) -> None:
        job_dir.mkdir(parents=True, exist_ok=True)
        latest = self.latest_version(job_dir.name)
        if version <= latest:
            raise errors.InvalidArgument(f"{version} is not newer than the latest published {latest}",
                                         field="version", job_id=job_dir.name)
        tmp = job_dir / f".v{version}.{os.getpid()}.tmp"
        if pinned:
            (job_dir / f"v{version}.pinned").touch()
        tmp.write_bytes(blob)
        os.replace(tmp, self._path(job_dir, version))  # readers see the whole file or none
        for old in self._versions(job_dir)[:-self.keep_versions]:
            if not (job_dir / f"v{old}.pinned").exists():
                self._path(job_dir, old).unlink(missing_ok=True)

    def latest_version(self, job_id: str) -> int:
        versions = self._versions(self._job_dir(job_id))
        return versions[-1] if versions else -1

    def subscribe(self, job_id: str, have_version: int, stop: threading.Event) -> Iterator[SafetensorsFile]:
        job_dir = self._job_dir(job_id)
        while not stop.is_set():
            latest = self.latest_version(job_id)
            if latest > have_version:  # a subscriber that missed versions gets the latest one only
                have_version = latest
                yield SafetensorsFile(job_id, latest, str(self._path(job_dir, latest)))
                continue
            stop.wait(self.poll_s)

    def fetch(self, job_id: str, version: int, release: bool = False) -> SafetensorsFile | SafetensorsBlob:
        job_dir = self._job_dir(job_id)
        path = self._path(job_dir, version)
        try:
            if not release:
                if not path.exists():
                    raise FileNotFoundError(path)
                return SafetensorsFile(job_id, version, str(path))
            # Released: a later publish may prune the file, so the caller gets the bytes read now.
            blob = path.read_bytes()
        except FileNotFoundError:
            raise errors.NotFound(f"job {job_id!r} has no version {version} (kept: last {self.keep_versions})",
                                  field="version", job_id=job_id) from None
        (job_dir / f"v{version}.pinned").unlink(missing_ok=True)
        return SafetensorsBlob(job_id, version, blob, hashlib.sha256(blob).hexdigest())
