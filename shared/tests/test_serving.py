"""The service bootstrap, on a real service process: health, reflection, metrics, SIGTERM drain."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import grpc
import httpx
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from scalerl.serving import channel, check_health


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_service_process_health_reflection_metrics_and_sigterm(tmp_path):
    grpc_port, metrics_port = free_port(), free_port()
    env = os.environ | {"SCALERL_GRPC_PORT": str(grpc_port), "SCALERL_METRICS_PORT": str(metrics_port),
                        "SCALERL_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "scalerl", "reward-grader"], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        addr = f"127.0.0.1:{grpc_port}"
        deadline = time.monotonic() + 60
        while check_health(addr) != "SERVING":
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert check_health(addr, "scalerl.v1.RewardGrader") == "SERVING"
        with channel(addr) as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            reply = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        names = {s.name for s in reply.list_services_response.service}
        assert {"scalerl.v1.RewardGrader", "grpc.health.v1.Health"} <= names
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "scalerl_grader_items_total" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    logs = proc.stderr.read().splitlines()
    assert any('"msg": "stopped"' in line for line in logs), logs[-5:]
    assert all(line.startswith("{") for line in logs if line.strip())  # structured lines


def test_unknown_service_exits_2():
    proc = subprocess.run([sys.executable, "-m", "scalerl", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown service" in proc.stderr


def test_health_of_nothing_is_unreachable():
    assert check_health(f"127.0.0.1:{free_port()}", timeout=0.5) == "UNREACHABLE"
