"""One RPC for many concurrent callers.

A generator finishes groups in bursts (every prompt of a lease is sampled together), and on a 2-core box a
gRPC round trip per group to the grader and another to the buffer cost more CPU than sampling the group. A
Coalescer keeps at most one call in flight: whatever is submitted while it runs goes out together in the
next call, so under load calls grow to the burst size and when idle a lone item still goes out at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any


class Coalescer:
    def __init__(self, call: Callable[[list], Sequence[Any]], max_items: int):
        """``call(items) -> results``, one result per item in order; blocking (it runs in a worker thread)."""
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self.call, self.max_items = call, max_items
        self.pending: list[tuple[list, asyncio.Future]] = []
        self.draining = False
        self.calls = 0  # for tests and metrics

    async def submit(self, items: list) -> list:
        """The results of ``items``; raises what the call raised for the batch they went out in."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((list(items), future))
        if not self.draining:
            self.draining = True
            # After this tick, so that submissions made in the same tick go out together.
            loop.call_soon(lambda: asyncio.ensure_future(self._drain()))
        return await future

    def _take(self) -> list[tuple[list, asyncio.Future]]:
        batch, size = [], 0
        while self.pending and (not batch or size + len(self.pending[0][0]) <= self.max_items):
            items, future = self.pending.pop(0)
            if future.done():  # its caller was cancelled
                continue
            batch.append((items, future))
            size += len(items)
        return batch

    async def _drain(self) -> None:
        try:
            while self.pending:
                batch = self._take()
                if not batch:
                    continue
                flat = [x for items, _ in batch for x in items]
                self.calls += 1
                try:
                    results = list(await asyncio.to_thread(self.call, flat))
                    if len(results) != len(flat):
                        raise RuntimeError(f"{len(results)} results for {len(flat)} items")
                except Exception as exc:  # noqa: BLE001 - every caller of this batch gets it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                offset = 0
                for items, future in batch:
                    if not future.done():
                        future.set_result(results[offset:offset + len(items)])
                    offset += len(items)
        finally:
            self.draining = False
