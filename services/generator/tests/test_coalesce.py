"""Coalescer: concurrent submissions share calls, results go back to the right caller, errors to every caller
of the failed batch, and a cancelled caller's items are not sent."""

from __future__ import annotations

import asyncio
import threading

import pytest

from scalerl_generator.coalesce import Coalescer


def test_same_tick_submissions_share_one_call_and_get_their_own_results():
    calls = []

    def call(items):
        calls.append(list(items))
        return [x * 10 for x in items]

    async def go():
        c = Coalescer(call, max_items=100)
        return await asyncio.gather(*(c.submit([i, i + 100]) for i in range(5))), c

    results, c = asyncio.run(go())
    assert results == [[i * 10, (i + 100) * 10] for i in range(5)]
    assert calls == [[0, 100, 1, 101, 2, 102, 3, 103, 4, 104]] and c.calls == 1


def test_submissions_during_a_call_go_out_together_in_the_next_one():
    release = threading.Event()
    calls = []

    def call(items):
        calls.append(list(items))
        if len(calls) == 1:
            release.wait(5)
        return list(items)

    async def go():
        c = Coalescer(call, max_items=100)
        first = asyncio.ensure_future(c.submit(["a"]))
        while not calls:  # the first call is in flight
            await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(c.submit([x])) for x in "bcd"]
        await asyncio.sleep(0.01)
        release.set()
        return await first, await asyncio.gather(*later)

    first, later = asyncio.run(go())
    assert first == ["a"] and later == [["b"], ["c"], ["d"]]
    assert calls == [["a"], ["b", "c", "d"]]


def test_max_items_splits_batches_without_splitting_a_submission():
    calls = []

    def call(items):
        calls.append(len(items))
        return items

    async def go():
        c = Coalescer(call, max_items=5)
        return await asyncio.gather(*(c.submit([i] * 3) for i in range(4)))

    assert asyncio.run(go()) == [[i] * 3 for i in range(4)]
    assert calls == [3, 3, 3, 3]  # 3 + 3 > 5: one submission per call, none split


def test_errors_reach_every_caller_of_the_batch_and_the_next_batch_still_runs():
    calls = []

    def call(items):
        calls.append(list(items))
        if "bad" in items:
            raise ConnectionError("grader down")
        return items

    async def go():
        c = Coalescer(call, max_items=100)
        batch = await asyncio.gather(c.submit(["ok"]), c.submit(["bad"]), return_exceptions=True)
        return batch, await c.submit(["again"])

    batch, again = asyncio.run(go())
    assert all(isinstance(r, ConnectionError) for r in batch)
    assert again == ["again"] and calls[-1] == ["again"]


def test_wrong_result_count_is_an_error_not_a_misassignment():
    async def go():
        c = Coalescer(lambda items: items[:-1], max_items=10)
        return await asyncio.gather(c.submit([1]), c.submit([2]), return_exceptions=True)

    assert all(isinstance(r, RuntimeError) for r in asyncio.run(go()))


def test_cancelled_caller_items_are_not_sent():
    calls = []

    def call(items):
        calls.append(list(items))
        return items

    async def go():
        c = Coalescer(call, max_items=10)
        doomed = asyncio.ensure_future(c.submit(["x"]))
        kept = asyncio.ensure_future(c.submit(["y"]))
        await asyncio.sleep(0)  # both submitted
        doomed.cancel()
        return await kept

    assert asyncio.run(go()) == ["y"]
    assert calls == [["y"]]


def test_max_items_must_be_positive():
    with pytest.raises(ValueError):
        Coalescer(lambda items: items, max_items=0)
