"""Verifiers run in a bounded pool of worker processes, one item at a time each. A verifier past its item's
timeout is abandoned by killing its process, and a fresh one takes its place: a hung verifier costs one process
start (about a second, in the background), never a thread or a worker forever, as a thread pool would (threads
cannot be stopped). Memory: one Python process per worker plus what its verifiers import (math-verify and sympy
on first use, ~100 MB); a replacement imports the packages of the verifiers used so far before it takes work.

Processes start by `spawn` (forking a process that runs gRPC threads is unsafe). A verifier travels to the worker
by pickle: its function must be importable by name (a module-level function), as the registered ones are; the
worker runs it on its main thread, so math-verify's own signal-based timeouts work there."""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import pickle
import queue
import threading
from multiprocessing.connection import Connection

from scalerl.tasks import Verifier
from scalerl_reward_grader.metrics import WORKER_RESTARTS

log = logging.getLogger(__name__)

READY = "ready"
STARTED = "started"


class VerifierTimeout(Exception):
    """The verifier did not answer within the item's timeout; its process was killed."""


class VerifierFailed(Exception):
    """The verifier raised (the message is its exception, as `Type: message`) or its process died."""


def _import(packages) -> None:
    for name in packages:
        try:
            importlib.import_module(name)
        except Exception:  # a verifier that needs it reports the missing package itself
            pass


def _serve(conn: Connection, preload: list[str]) -> None:
    """A worker process: import what the verifiers need, then grade one item per message until the pipe closes."""
    _import(preload)
    conn.send(READY)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            verifier, response, answer, metadata = pickle.loads(data)
            _import(verifier.packages)
        except Exception as err:
            conn.send((False, f"{type(err).__name__}: {err}"))
            continue
        conn.send(STARTED)  # imports done: the item's timeout runs from here
        try:
            conn.send((True, float(verifier(response, answer, metadata))))
        except Exception as err:
            conn.send((False, f"{type(err).__name__}: {err}"))


class _Worker:
    def __init__(self, context, preload: list[str]):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, preload), name="verifier", daemon=True)
        self.process.start()
        child.close()

    def ready(self, timeout_s: float) -> bool:
        try:
            return self.conn.poll(timeout_s) and self.conn.recv() == READY
        except (EOFError, OSError):
            return False

    def kill(self) -> None:
        self.process.kill()
        self.process.join(10)
        self.conn.close()


class VerifierPool:
    def __init__(self, workers: int, start_timeout_s: float = 120.0):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.start_timeout_s = start_timeout_s
        self._context = multiprocessing.get_context("spawn")
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._preload = {"scalerl.tasks"}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        for _ in range(workers):
            self._start()

    @property
    def processes(self) -> list[int]:
        """The pids of the live workers (tests and metrics)."""
        with self._lock:
            return [w.process.pid for w in self._all if w.process.is_alive()]

    def _start(self) -> None:
        """Start a worker; it takes work once it has imported what the verifiers used so far need."""
        with self._lock:
            if self._closed.is_set():
                return
            worker = _Worker(self._context, sorted(self._preload))
            self._all.add(worker)
        threading.Thread(target=self._admit, args=(worker,), name="verifier-start", daemon=True).start()

    def _admit(self, worker: _Worker) -> None:
        if worker.ready(self.start_timeout_s) and not self._closed.is_set():
            self._idle.put(worker)
            return
        self._discard(worker)
        if not self._closed.is_set():
            log.error("a verifier process did not start; trying again")
            self._closed.wait(5.0)
            self._start()

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.kill()

    def _replace(self, worker: _Worker) -> None:
        WORKER_RESTARTS.inc()
        self._discard(worker)
        self._start()

    def _take(self) -> _Worker:
        while True:
            try:
                return self._idle.get(timeout=1.0)
            except queue.Empty:
                if self._closed.is_set():
                    raise VerifierFailed("the grader is shutting down") from None

    def run(self, verifier: Verifier, response: str, answer: str, metadata: dict, timeout_s: float) -> float:
        """The verifier's reward for one item, computed in a worker process within `timeout_s` (waiting for a
        free worker not counted). Raises VerifierTimeout or VerifierFailed."""
        with self._lock:
            self._preload.update(verifier.packages)
        worker = self._take()
        try:
            worker.conn.send((verifier, response, answer, metadata))  # pickled whole before a byte is written
        except Exception as err:  # not picklable: the worker never saw it
            self._idle.put(worker)
            raise VerifierFailed(f"{type(err).__name__}: {err}") from err
        try:
            # a first use imports the verifier's packages (reasoning-gym: seconds), not counted in its timeout
            answered = worker.conn.poll(self.start_timeout_s)
            reply = worker.conn.recv() if answered else (False, "")
            if reply == STARTED:
                answered = worker.conn.poll(timeout_s)
                reply = worker.conn.recv() if answered else (False, "")
            ok, value = reply
        except (EOFError, OSError):
            self._replace(worker)
            raise VerifierFailed("the verifier's process died") from None
        if not answered:
            self._replace(worker)
            raise VerifierTimeout(f"verifier timed out after {timeout_s:.1f}s")
        self._idle.put(worker)
        if not ok:
            raise VerifierFailed(value)
        return value

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            worker.kill()
