"""The gRPC services the api drives: replay-buffer (job set-up and clean-up) and forecaster (curves, fits)."""

from __future__ import annotations

import logging

import grpc

from scalerl.logs import job_logger
from scalerl.serving import channel
from scalerl.settings import Settings
from scalerl.v1 import (common_pb2, forecaster_pb2, forecaster_pb2_grpc, replay_buffer_pb2,
                        replay_buffer_pb2_grpc)

log = logging.getLogger(__name__)


class BackendError(Exception):
    """A backend refused or failed a call; the message is its status details."""


class BackendUnavailable(BackendError):
    """A backend the REST request needs cannot answer now (HTTP 503)."""


class NoFit(BackendError):
    """The forecaster has no points or no fit for a job yet (HTTP 409)."""


class Refused(BackendError):
    """The forecaster refused the request as invalid (HTTP 422)."""


def _forecaster_error(err: grpc.RpcError) -> BackendError:
    code = err.code()
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
        return NoFit(err.details())
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return Refused(err.details())
    return BackendUnavailable(f"forecaster: {code.name}")


class Backends:
    def __init__(self, settings: Settings):
        self._buffer_channel = channel(settings.replay_buffer_addr)
        self._forecaster_channel = channel(settings.forecaster_addr)
        self.buffer = replay_buffer_pb2_grpc.ReplayBufferStub(self._buffer_channel)
        self.forecaster = forecaster_pb2_grpc.ForecasterStub(self._forecaster_channel)

    def init_job(self, job_id: str, recipe_json: str) -> int:
        """Prepare the job's prompt pool in the replay buffer -> its size; BackendError when that fails."""
        job = common_pb2.Job(job_id=job_id, recipe_json=recipe_json, state="running")
        try:
            return self.buffer.InitJob(replay_buffer_pb2.InitJobRequest(job=job), timeout=120).pool_size
        except grpc.RpcError as err:
            raise BackendError(err.details()) from err

    def cleanup_job(self, job_id: str) -> None:
        try:
            self.buffer.CleanupJob(replay_buffer_pb2.CleanupJobRequest(job_id=job_id), timeout=30)
        except grpc.RpcError as err:
            job_logger(log, job_id).warning("replay-buffer clean-up failed: %s", err.code().name)

    def curve(self, job_id: str, eval_set: str = "") -> forecaster_pb2.Curve:
        try:
            return self.forecaster.GetCurve(forecaster_pb2.GetCurveRequest(job_id=job_id, eval_set=eval_set),
                                            timeout=10)
        except grpc.RpcError as err:
            raise _forecaster_error(err) from err

    def forecast(self, job_id: str, eval_set: str = "") -> forecaster_pb2.Forecast:
        try:
            return self.forecaster.GetForecast(forecaster_pb2.GetForecastRequest(job_id=job_id, eval_set=eval_set),
                                               timeout=10)
        except grpc.RpcError as err:
            raise _forecaster_error(err) from err

    def correlations(self, job_id: str) -> forecaster_pb2.Correlations:
        """Spearman correlation of each downstream eval set with iid validation; NoFit without points."""
        try:
            return self.forecaster.GetCorrelations(forecaster_pb2.GetCorrelationsRequest(job_id=job_id), timeout=10)
        except grpc.RpcError as err:
            raise _forecaster_error(err) from err

    def decision(self, job_id: str, target: float | None) -> forecaster_pb2.Decision:
        """Scale-or-stop advice; NoFit while the job has no fit."""
        try:
            return self.forecaster.GetDecision(forecaster_pb2.GetDecisionRequest(job_id=job_id, target=target or 0.0),
                                               timeout=30)
        except grpc.RpcError as err:
            raise _forecaster_error(err) from err

    def compare(self, job_ids: list[str], level: float) -> forecaster_pb2.Comparison:
        """Two jobs' fits and the verdict; NoFit naming a job without a fit, Refused for bad arguments."""
        try:
            return self.forecaster.Compare(forecaster_pb2.CompareRequest(job_ids=job_ids, level=level), timeout=60)
        except grpc.RpcError as err:
            raise _forecaster_error(err) from err

    def close(self) -> None:
        self._buffer_channel.close()
        self._forecaster_channel.close()
