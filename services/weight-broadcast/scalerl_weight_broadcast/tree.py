"""The relay tree per job: where each subscriber gets its chunks. Slot i of a `fanout`-ary heap; slots
0..fanout-1 hang off the hub, slot i >= fanout off slot i // fanout - 1. The hub thus streams each version to at
most `fanout` subscribers however many join; each of them forwards to at most `fanout` more."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class _Job:
    slots: list[str | None] = field(default_factory=list)  # relay address per slot; None: a hole
    by_id: dict[str, int] = field(default_factory=dict)


class RelayTree:
    def __init__(self, fanout: int = 2):
        self.fanout = fanout
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def _parent_slot(self, slot: int) -> int | None:
        return None if slot < self.fanout else slot // self.fanout - 1

    def join(self, job_id: str, subscriber_id: str, relay_addr: str, failed_parent: str = "") -> tuple[str, int]:
        """(address to subscribe at, "" for the hub; depth). A subscriber that relays nothing streams from the
        hub (relaying is off)."""
        with self._lock:
            job = self._jobs.setdefault(job_id, _Job())
            if failed_parent:
                for i, addr in enumerate(job.slots):
                    if addr == failed_parent:
                        job.slots[i] = None  # a hole: the next joiner takes it, its children skip past it
                        job.by_id = {k: v for k, v in job.by_id.items() if v != i}
            if not relay_addr:
                return "", 1
            slot = job.by_id.get(subscriber_id)
            if slot is None or job.slots[slot] != relay_addr:
                slot = next((i for i, a in enumerate(job.slots) if a is None), len(job.slots))
                if slot == len(job.slots):
                    job.slots.append(None)
                job.slots[slot] = relay_addr
                job.by_id[subscriber_id] = slot
            depth, parent = 1, self._parent_slot(slot)
            while parent is not None and job.slots[parent] is None:  # skip holes: nearest live ancestor
                parent = self._parent_slot(parent)
            p = parent
            while p is not None:
                depth += 1
                p = self._parent_slot(p)
            return ("" if parent is None else job.slots[parent]), depth

    def members(self, job_id: str) -> int:
        with self._lock:
            job = self._jobs.get(job_id)
            return 0 if job is None else sum(a is not None for a in job.slots)

    def drop_job(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)
