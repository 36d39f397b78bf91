"""Test support shared by the generator's tests and the end-to-end tests that drive an engine directly."""

from __future__ import annotations

import asyncio
import threading


class LoopThread:
    """An event loop on its own thread: the engine's coroutines run there (results come back to the loop that
    started the engine), so tests stay synchronous and need no pytest-asyncio."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engine-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 300.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
