"""The service bootstrap, on a real service process: health, reflection, metrics, SIGTERM drain."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import httpx
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from scalerl.ports import unused_port
from scalerl.serving import channel, check_health


def test_service_process_health_reflection_metrics_and_sigterm(tmp_path):
    grpc_port, metrics_port = unused_port(), unused_port()
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
    assert check_health(f"127.0.0.1:{unused_port()}", timeout=0.5) == "UNREACHABLE"


def _start_buffer(grpc_port: int, redis_url: str, log_path) -> subprocess.Popen:
    env = os.environ | {"SCALERL_GRPC_PORT": str(grpc_port), "SCALERL_METRICS_PORT": str(unused_port()),
                        "SCALERL_REDIS_URL": redis_url}
    with open(log_path, "a") as log:
        proc = subprocess.Popen([sys.executable, "-m", "scalerl", "replay-buffer"], env=env, stdout=log, stderr=log)
    addr = f"127.0.0.1:{grpc_port}"
    deadline = time.monotonic() + 60
    while check_health(addr) != "SERVING":
        assert proc.poll() is None and time.monotonic() < deadline, open(log_path).read()[-3000:]
        time.sleep(0.1)
    return proc


def test_a_call_in_flight_survives_a_restart_of_the_server_within_its_deadline(tmp_path):
    """The learner's ReadBatch blocks in the replay buffer while that process is killed (kill -9) and started again
    on the same port: the call is retried on the new process and answers within its deadline."""
    from concurrent.futures import ThreadPoolExecutor

    from scalerl.recipe import Recipe
    from scalerl.v1 import common_pb2, replay_buffer_pb2, replay_buffer_pb2_grpc
    from scalerl_replay_buffer.embedded import EmbeddedValkey

    grpc_port, log_path = unused_port(), tmp_path / "buffer.log"
    recipe = Recipe(task={"num_train_prompts": 8}, pipeline={"prompts_per_batch": 4})
    with EmbeddedValkey(data_dir=tmp_path / "valkey") as valkey, ThreadPoolExecutor(2) as pool:
        proc = _start_buffer(grpc_port, valkey.url, log_path)
        try:
            with channel(f"127.0.0.1:{grpc_port}") as ch:
                stub = replay_buffer_pb2_grpc.ReplayBufferStub(ch)
                stub.InitJob(replay_buffer_pb2.InitJobRequest(
                    job=common_pb2.Job(job_id="j", recipe_json=recipe.model_dump_json())), timeout=30)
                read = pool.submit(stub.ReadBatch, replay_buffer_pb2.ReadBatchRequest(
                    job_id="j", consumer="learner", max_groups=4, learner_version=0, block_ms=3000), timeout=60)
                time.sleep(1.0)  # the call is blocked in the server now
                proc.kill()
                proc.wait()
                time.sleep(2.0)  # the port is closed for a while: the call waits for the new process
                proc = _start_buffer(grpc_port, valkey.url, log_path)
                assert read.result(timeout=90).groups is not None  # answered by the new process
                # and a new call on the same channel goes through at once
                assert stub.GetStats(replay_buffer_pb2.GetStatsRequest(job_id="j"), timeout=10).pool_size == 8
        finally:
            proc.kill()
            proc.wait()
