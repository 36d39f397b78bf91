"""SIGTERM mid-job: the learner process writes a checkpoint of the steps it trained before it exits (within
SCALERL_DRAIN_TIMEOUT_S), so the job resumes from there instead of from the last periodic checkpoint. A real
learner process and signal; real replay-buffer (Valkey) and filesystem weight transport; the control plane is
a small servicer answering as the real one does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent import futures

import grpc
import pytest
import redis

from scalerl.models import build_tiny_model
from scalerl.recipe import Recipe
from scalerl.settings import Settings
from scalerl.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc
from scalerl_learner.checkpoint import latest_checkpoint
from scalerl_learner.runner import JobRunner
from scalerl_replay_buffer.store import BufferStore
from scalerl_replay_buffer.testing import redis_url, start_buffer_server  # noqa: F401  (fixture)


class ControlPlane(control_plane_pb2_grpc.ControlPlaneServicer):
    def __init__(self, job: common_pb2.Job):
        self.job = job
        self.steps: list[int] = []

    def GetActiveJob(self, request, context):
        return control_plane_pb2.ActiveJob(job=self.job)

    def ReportProgress(self, request, context):
        self.steps.append(request.step)
        return control_plane_pb2.ReportProgressResponse(keep_running=True)

    def FinishJob(self, request, context):
        return control_plane_pb2.FinishJobResponse()


def group(job_id: str, i: int) -> common_pb2.ScoredGroup:
    completions = [common_pb2.ScoredCompletion(
        completion=common_pb2.Completion(token_ids=[20 + i, 21, 22], logprobs=[-0.5] * 3, loss_mask=[True] * 3,
                                         versions=[common_pb2.VersionSpan(version=0, start=0, end=3)]),
        reward=r, grade_status=common_pb2.GRADE_STATUS_GRADED) for r in (1.0, 0.0)]
    return common_pb2.ScoredGroup(job_id=job_id, group_id=uuid.uuid4().hex, completions=completions,
                                  prompt_token_ids=[1, 5, 6], prompt=common_pb2.Prompt(job_id=job_id,
                                                                                       prompt_id=f"train-{i}"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", sft_steps=5)


def test_sigterm_mid_job_checkpoints_the_trained_steps_and_the_job_resumes_there(redis_url, tmp_path, model_dir):
    job_id = f"sigterm-{uuid.uuid4().hex[:8]}"
    recipe = Recipe(model={"path": str(model_dir)}, pipeline={"prompts_per_batch": 2},
                    task={"num_train_prompts": 64, "num_validation_prompts": 4},
                    validation={"num_prompts": 4, "at_step_zero": False, "every_steps": 1000},
                    budget={"max_steps": 1000, "checkpoint_every_steps": 1000})
    job = common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json())
    client = redis.Redis.from_url(redis_url)
    store = BufferStore(client)
    store.init_job(job_id, recipe)
    store.write_groups([group(job_id, i) for i in range(6)])  # 3 steps, then the learner waits for more
    buffer = start_buffer_server(client)
    control = ControlPlane(job)
    control_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(control, control_server)
    control_port = control_server.add_insecure_port("127.0.0.1:0")
    control_server.start()
    env = {**os.environ, "SCALERL_SERVICE": "learner", "SCALERL_GRPC_PORT": "0", "SCALERL_METRICS_PORT": "0",
           "SCALERL_DATA_DIR": str(tmp_path), "SCALERL_CONTROL_PLANE_ADDR": f"127.0.0.1:{control_port}",
           "SCALERL_REPLAY_BUFFER_ADDR": f"127.0.0.1:{buffer.grpc_port}", "SCALERL_DRAIN_TIMEOUT_S": "60",
           "SCALERL_WEIGHT_TRANSPORT__TYPE": "filesystem", "SCALERL_WEIGHT_TRANSPORT__ROOT": str(tmp_path / "w"),
           "SCALERL_FORECASTER_ADDR": "127.0.0.1:1", "SCALERL_EVALUATOR_ADDR": "127.0.0.1:1"}
    proc = subprocess.Popen([sys.executable, "-c", "from scalerl.settings import Settings; "
                             "from scalerl_learner.main import main; main(Settings())"], env=env)
    try:
        deadline = time.monotonic() + 180
        while 3 not in control.steps:
            assert proc.poll() is None, "the learner exited early"
            assert time.monotonic() < deadline, f"no 3 steps reported: {control.steps}"
            time.sleep(0.2)
        ckpt_root = tmp_path / "checkpoints" / job_id
        assert latest_checkpoint(ckpt_root) is None  # no periodic checkpoint yet (every 1000 steps)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        control_server.stop(0)
    saved = latest_checkpoint(ckpt_root)
    assert saved is not None and saved.step == 3 and saved.policy_version == 3  # v0 at load, then one per step

    settings = Settings(data_dir=tmp_path, replay_buffer_addr=f"127.0.0.1:{buffer.grpc_port}",
                        weight_transport={"type": "filesystem", "root": str(tmp_path / "w")},
                        control_plane_addr="127.0.0.1:1", forecaster_addr="127.0.0.1:1",
                        evaluator_addr="127.0.0.1:1")
    resumed = JobRunner(settings, job, control=None, stop=threading.Event())
    resumed.load()
    assert resumed.step == 3 and resumed.version == 4
    resumed.close()
    buffer.stop(0)
    client.close()
