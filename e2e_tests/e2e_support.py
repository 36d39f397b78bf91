"""Helpers of the end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from scalerl_stack.supervisor import Stack, free_port

STACK_ENV = {"SCALERL_POLL_INTERVAL_S": "0.5", "SCALERL_LOG_JSON": "true", "SCALERL_MAX_GROUPS_IN_FLIGHT": "8"}


@contextlib.contextmanager
def running_stack(data_dir: Path, token: str, **stack_args):
    """Every service on free local ports under the supervisor, until SERVING; yields (stack, api URL). On exit
    the stack stops, the environment is restored and each service's log tail is printed."""
    http_port = free_port()
    saved = dict(os.environ)
    os.environ.update({"SCALERL_API_TOKEN": token, "SCALERL_HTTP_PORT": str(http_port), **STACK_ENV})
    os.environ.pop("REDIS_URL", None)
    stack = Stack(Path(data_dir), free_ports=True, **stack_args)
    stack.start()
    try:
        if not stack.wait_serving(300):
            raise RuntimeError(f"stack not SERVING: {stack.health()}; logs in {data_dir / 'logs'}")
        yield stack, f"http://127.0.0.1:{http_port}"
    finally:
        stack.stop()
        os.environ.clear()
        os.environ.update(saved)
        for log in sorted((Path(data_dir) / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print(f"==== {log.name}\n" + "\n".join(tail))


def wait_for(predicate, timeout: float, interval: float = 1.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
