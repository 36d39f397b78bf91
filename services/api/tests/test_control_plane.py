"""The lifecycle over the real ControlPlane gRPC servicer and scheduler: queued → running → final."""

from __future__ import annotations

import logging

import grpc
import pytest

from scalerl.control import ControlPlaneClient
from scalerl.serving import ServiceRegistration, start_server
from scalerl.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, replay_buffer_pb2
from scalerl_api.control_plane import ControlPlaneService
from scalerl_api.lifecycle import JobLifecycle
from scalerl_api.scheduler import Scheduler

from test_jobs_api import SMALL, submit


@pytest.fixture
def control(app):
    service = ControlPlaneService(JobLifecycle(app.state.sessionmaker, app.state.backends))
    running = start_server(ServiceRegistration(
        ["scalerl.v1.ControlPlane"], lambda s: control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(service, s)),
        host="127.0.0.1", grpc_port=0, metrics_port=None, max_workers=4)
    client = ControlPlaneClient(f"127.0.0.1:{running.grpc_port}", "test")
    yield client
    client.close()
    running.stop(0)


def test_jobs_run_one_at_a_time_and_finish(client, app, control):
    scheduler = Scheduler(app.state.sessionmaker, app.state.backends)
    first, second = submit(client), submit(client)
    assert control.active_job() is None
    scheduler.tick()
    active = control.active_job()
    assert active.job_id == first["id"]
    # The scheduler prepared the prompt pool in the replay buffer.
    stats = app.state.backends.buffer.GetStats(replay_buffer_pb2.GetStatsRequest(job_id=first["id"]))
    assert stats.pool_size == 32
    scheduler.tick()  # one running job at a time
    assert client.get(f"/v1/jobs/{second['id']}").json()["state"] == "queued"

    progress = control_plane_pb2.JobProgress(job_id=first["id"], step=2, policy_version=2, last_pass_rate=0.4,
                                             compute=common_pb2.ComputeSplit(learner_device_hours=0.1,
                                                                             generator_device_hours=0.3,
                                                                             generated_tokens=1000))
    assert control.report(progress) is True
    job = client.get(f"/v1/jobs/{first['id']}").json()
    assert job["step"] == 2 and job["last_pass_rate"] == 0.4
    assert job["compute"]["total_device_hours"] == pytest.approx(0.4)

    control.finish(first["id"], "succeeded", "budget reached")
    assert client.get(f"/v1/jobs/{first['id']}").json()["state"] == "succeeded"
    with pytest.raises(grpc.RpcError) as err:
        control.finish(first["id"], "failed", "late")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    scheduler.tick()
    assert control.active_job().job_id == second["id"]


def test_cancel_stops_the_reporter(client, app, control):
    scheduler = Scheduler(app.state.sessionmaker, app.state.backends)
    job = submit(client)
    scheduler.tick()
    client.post(f"/v1/jobs/{job['id']}/cancel")
    assert control.report(control_plane_pb2.JobProgress(job_id=job["id"], step=1)) is False
    assert control.active_job() is None


def test_bad_finish_state_is_invalid_argument(client, app, control):
    job = submit(client)
    with pytest.raises(grpc.RpcError) as err:
        control.finish(job["id"], "exploded")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "state" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        control.finish(job["id"], "running")  # a state, but not a final one
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "state" in err.value.details()


def test_unknown_job_is_not_found_and_a_missing_id_invalid(control):
    for call in (lambda: control.finish("no-such-job", "failed"),
                 lambda: control._stub.ReportProgress(control_plane_pb2.JobProgress(job_id="no-such-job"))):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "job_id" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        control._stub.ReportProgress(control_plane_pb2.JobProgress(step=1))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "job_id" in err.value.details()


def test_scheduler_logs_carry_the_job_id_as_a_field(client, app, caplog):
    job = submit(client)
    with caplog.at_level(logging.INFO, logger="scalerl_api"):
        Scheduler(app.state.sessionmaker, app.state.backends).tick()
    (record,) = [r for r in caplog.records if r.name == "scalerl_api.scheduler"]
    assert record.job_id == job["id"] and job["id"] not in record.getMessage()


def test_failed_pool_preparation_fails_the_job_with_reason(client, app):
    scheduler = Scheduler(app.state.sessionmaker, app.state.backends)
    job = submit(client, recipe=SMALL | {"task": {"name": "reasoning_gym/no_such_dataset",
                                                  "num_train_prompts": 4, "num_validation_prompts": 8}})
    scheduler.tick()
    stored = client.get(f"/v1/jobs/{job['id']}").json()
    assert stored["state"] == "failed" and "replay-buffer" in stored["reason"]


def test_job_becomes_active_only_once_its_prompt_pool_is_ready(client, app, control, monkeypatch):
    """Services start on the active job at once (the learner reads its batch): the pool must exist by then."""
    scheduler = Scheduler(app.state.sessionmaker, app.state.backends)
    job = submit(client)
    real_init = app.state.backends.init_job
    seen = {}

    def observed_init(job_id, recipe_json):
        seen["active_during_init"] = control.active_job()
        seen["state_during_init"] = client.get(f"/v1/jobs/{job_id}").json()["state"]
        return real_init(job_id, recipe_json)

    monkeypatch.setattr(app.state.backends, "init_job", observed_init)
    scheduler.tick()
    assert seen == {"active_during_init": None, "state_during_init": "queued"}
    assert control.active_job().job_id == job["id"]


def test_job_cancelled_while_its_pool_is_prepared_stays_cancelled(client, app, control, monkeypatch):
    scheduler = Scheduler(app.state.sessionmaker, app.state.backends)
    job = submit(client)
    real_init = app.state.backends.init_job

    def cancel_during_init(job_id, recipe_json):
        pool = real_init(job_id, recipe_json)
        assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
        return pool

    monkeypatch.setattr(app.state.backends, "init_job", cancel_during_init)
    scheduler.tick()
    assert client.get(f"/v1/jobs/{job['id']}").json()["state"] == "cancelled"
    assert control.active_job() is None


def _learner_failure() -> str:
    """The reason the learner reports for a job its exception failed: the error and a traceback."""
    import traceback

    try:
        open("/srv/scalerl/var/checkpoints/missing/step-7.pt")
    except OSError as err:
        return f"learner: {type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
    raise AssertionError("the file exists")


def test_a_failed_job_shows_one_readable_line_and_logs_the_traceback(client, app, control, caplog):
    job = submit(client)
    Scheduler(app.state.sessionmaker, app.state.backends).tick()
    reason = _learner_failure()
    assert "Traceback" in reason and 'File "' in reason
    with caplog.at_level(logging.INFO, logger="scalerl_api"):
        control.finish(job["id"], "failed", reason)
    shown = client.get(f"/v1/jobs/{job['id']}").json()["reason"]
    assert shown == "learner: FileNotFoundError: [Errno 2] No such file or directory: 'step-7.pt'"
    assert "/" not in shown and "\n" not in shown
    assert any("Traceback" in r.getMessage() and r.job_id == job["id"] for r in caplog.records)


def test_a_failed_job_keeps_its_buffer_state_until_deleted(client, app, control):
    scheduler = Scheduler(app.state.sessionmaker, app.state.backends)
    job = submit(client)
    scheduler.tick()
    control.finish(job["id"], "failed", "learner: RuntimeError: boom")
    stats = app.state.backends.buffer.GetStats(replay_buffer_pb2.GetStatsRequest(job_id=job["id"]), timeout=10)
    assert stats.pool_size == 32  # kept for a post-mortem or a resume

    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 204
    assert client.get(f"/v1/jobs/{job['id']}").status_code == 404
    with pytest.raises(grpc.RpcError) as err:
        app.state.backends.buffer.GetStats(replay_buffer_pb2.GetStatsRequest(job_id=job["id"]), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_succeeded_job_frees_its_buffer_state_and_a_running_one_cannot_be_deleted(client, app, control):
    scheduler = Scheduler(app.state.sessionmaker, app.state.backends)
    job = submit(client)
    scheduler.tick()
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 409
    control.finish(job["id"], "succeeded", "budget reached")
    with pytest.raises(grpc.RpcError) as err:
        app.state.backends.buffer.GetStats(replay_buffer_pb2.GetStatsRequest(job_id=job["id"]), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert client.delete("/v1/jobs/no-such-job").status_code == 404


def test_compute_total_is_learner_plus_rollout_generators_everywhere(client, app, control):
    from prometheus_client import REGISTRY

    job = submit(client)
    Scheduler(app.state.sessionmaker, app.state.backends).tick()
    split = common_pb2.ComputeSplit(learner_device_hours=0.1, generator_device_hours=0.3,
                                    evaluator_device_hours=0.05)
    control.report(control_plane_pb2.JobProgress(job_id=job["id"], step=1, compute=split))
    compute = client.get(f"/v1/jobs/{job['id']}").json()["compute"]
    assert compute["total_device_hours"] == pytest.approx(0.4)  # the forecast's x-axis
    assert compute["evaluator_device_hours"] == pytest.approx(0.05)  # reported apart
    assert REGISTRY.get_sample_value("scalerl_api_job_compute_device_hours",
                                     {"job_id": job["id"]}) == pytest.approx(0.4)
    assert REGISTRY.get_sample_value("scalerl_api_job_evaluator_device_hours",
                                     {"job_id": job["id"]}) == pytest.approx(0.05)


def test_two_schedulers_racing_on_one_database_start_one_job(client, app, settings, monkeypatch):
    """Two api replicas: scheduler `a` finds no running job, then `b` (its own engine, one database) starts the
    oldest job before `a` reads the queue; `a` must not start the next one beside it."""
    from scalerl_api import crud
    from scalerl_api.db import make_engine, make_sessionmaker

    first, second = submit(client), submit(client)
    engine = make_engine(settings.database_url)
    a = Scheduler(make_sessionmaker(engine), app.state.backends)
    b = Scheduler(app.state.sessionmaker, app.state.backends)
    real_running_job = crud.running_job
    raced = []

    def b_starts_a_job_right_after_the_read(db):
        seen = real_running_job(db)
        if not raced:
            raced.append(True)
            b.tick()
        return seen

    monkeypatch.setattr(crud, "running_job", b_starts_a_job_right_after_the_read)
    a.tick()
    engine.dispose()
    assert raced
    states = {j["id"]: j["state"] for j in client.get("/v1/jobs").json()["jobs"]}
    assert states == {first["id"]: "running", second["id"]: "queued"}


def test_the_store_refuses_a_second_running_job(client, app):
    from sqlalchemy import update
    from sqlalchemy.exc import IntegrityError

    from scalerl_api.models import Job

    first, second = submit(client), submit(client)
    Scheduler(app.state.sessionmaker, app.state.backends).tick()
    with app.state.sessionmaker() as db, pytest.raises(IntegrityError):
        db.execute(update(Job).where(Job.id == second["id"]).values(state="running"))
        db.commit()
    assert client.get(f"/v1/jobs/{first['id']}").json()["state"] == "running"
