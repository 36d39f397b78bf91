"""The learner's side of publishing: each version is staged (copied out of the model's tensors) in the training
loop and sent by a thread of its own while the next step trains (`pipeline.publish_in_background`), or sent
before the loop goes on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scalerl.logs import job_logger
from scalerl.weights import NamedTensors, WeightTransport
from scalerl.weights.base import StagedVersion

log = logging.getLogger(__name__)


class Publisher:
    """At most one version is being sent at a time, so staging the next waits for the send before it (a transport
    keeps the previous version as the base of a delta, and its host buffers are reused). A transport that cannot
    send while training goes on (`sends_in_background` false: torch_distributed) is always sent in the foreground.

    A send that failed fails the training loop at its next `publish` or `flush`, as a publish in the loop would have
    failed it one step earlier."""

    def __init__(self, transport: WeightTransport, job_id: str, background: bool,
                 on_sent: Callable[[int, float], None] = lambda version, seconds: None):
        self.transport, self.job_id = transport, job_id
        self.background = background and transport.sends_in_background
        self.on_sent = on_sent
        """Called on the sending thread with (version, seconds the send took) after each send of `publish`."""
        self.sent_version = -1
        """The newest version `publish` has sent."""
        self._cond = threading.Condition()
        self._in_flight: tuple[int, StagedVersion] | None = None
        self._error: BaseException | None = None
        self._sending = threading.Lock()
        """Held around every send: `publish`'s and `republish`'s go one after another."""
        self.log = job_logger(log, job_id)
        self._closed = False

    def publish(self, version: int, tensors: NamedTensors, pinned: bool = False) -> float:
        """Stage `version` from `tensors` and send it (on the sending thread when in the background); returns the
        seconds the caller was held: the wait for the previous send, the staging, and in the foreground the send."""
        started = time.monotonic()
        self.flush()
        staged = self.transport.stage(self.job_id, version, tensors, pinned=pinned)
        if not self.background:
            self._send(version, staged)
            return time.monotonic() - started
        with self._cond:
            self._in_flight = (version, staged)
        try:
            threading.Thread(target=self._send_in_background, args=(version, staged), daemon=True,
                             name=f"publish-v{version}").start()
        except BaseException:
            staged.release()
            with self._cond:
                self._in_flight = None
            raise
        return time.monotonic() - started

    def _send(self, version: int, staged: StagedVersion) -> None:
        with self._sending:
            started = time.monotonic()
            staged.send()
            seconds = time.monotonic() - started
            try:
                self.on_sent(version, seconds)  # in the lock: before a re-publish changes how the last one went
            except Exception:  # noqa: BLE001 - the version was sent; a metric must not fail the job
                self.log.exception("after sending weights v%d", version)
        with self._cond:
            self.sent_version = max(self.sent_version, version)
            self._cond.notify_all()

    def _send_in_background(self, version: int, staged: StagedVersion) -> None:
        try:
            self._send(version, staged)
        except BaseException as err:  # noqa: BLE001 - handed to the training loop
            self.log.error("publishing weights v%d failed: %s", version, err)
            with self._cond:
                self._error = err
        finally:
            with self._cond:
                self._in_flight = None
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the send in flight; raises its error. False when `timeout` passed first."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._in_flight is None, timeout=timeout):
                return False
            error, self._error = self._error, None
        if error is not None:
            raise error
        return True

    def wait_sent(self, version: int, timeout: float | None = None) -> bool:
        """Whether `publish` has sent `version` (or a newer one), waiting for a send in flight; False when no send
        of it is under way (it failed, or was never published) or `timeout` passed."""
        with self._cond:
            self._cond.wait_for(lambda: self.sent_version >= version or self._in_flight is None
                                or self._in_flight[0] < version or self._closed, timeout=timeout)
            return self.sent_version >= version

    def republish(self, version: int, tensors: NamedTensors, pinned: bool = True) -> None:
        """Send an older version again now, on the caller's thread (validation re-publishes a pinned version the
        transport no longer holds), between `publish`'s sends."""
        with self._sending:
            self.transport.stage(self.job_id, version, tensors, pinned=pinned).send()

    def close(self, timeout: float) -> bool:
        """Wait up to `timeout` for the send in flight (its error is logged, not raised); whether none is left. The
        transport is not closed here: with a send still running it must not be."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # validations waiting for a version give up
            done = self._cond.wait_for(lambda: self._in_flight is None, timeout=timeout)
            self._error = None
            if not done:
                self.log.warning("weights v%d are still being sent after %.0f s", self._in_flight[0], timeout)
        return done
