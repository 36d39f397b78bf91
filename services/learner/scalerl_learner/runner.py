"""One job on the learner: batch → loss → step → publish version v+1 → checkpoint; validation and compute
accounting on the side. PipelineRL-k publishes after every step; PPO-off-policy-k after every k steps."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import torch

from scalerl.control import ControlPlaneClient
from scalerl.recipe import PipelineMode, Recipe, parse_recipe
from scalerl.serving import channel
from scalerl.settings import Settings
from scalerl.logs import job_logger
from scalerl.v1 import (common_pb2, control_plane_pb2, forecaster_pb2, forecaster_pb2_grpc, generator_pb2,
                        generator_pb2_grpc, replay_buffer_pb2, replay_buffer_pb2_grpc)
from scalerl_learner import metrics
from scalerl_learner.publisher import Publisher
from scalerl_learner.checkpoint import ResumeState, latest_checkpoint, restore_trainer_state, save_checkpoint
from scalerl_learner.trainer import StepInterrupted, Trainer, resolve_device
from scalerl_learner.validations import QueuedValidation, ValidationQueue, evaluations
from scalerl.models import resolve_model_path
from scalerl.weights import make_transport

log = logging.getLogger(__name__)

# How long one queued validation is retried while the evaluator or the forecaster is away (restarting, loading).
VALIDATION_DEADLINE_S = 1800.0
# How long closing a job waits for the version being sent before it lets the send run on without it.
PUBLISH_CLOSE_TIMEOUT_S = 30.0
# Answers after which a validation is not retried: the request itself is wrong.
VALIDATION_FINAL_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                                    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED})


class JobCancelled(Exception):
    pass


class JobRunner:
    FATAL: tuple[type[Exception], ...] = ()
    """Errors that end the learner process instead of failing the job (it resumes after the restart)."""
    devices = 1
    """Devices a step occupies: the wall time of a step counts this many times in the learner's device-hours."""

    def __init__(self, settings: Settings, job: common_pb2.Job, control: ControlPlaneClient,
                 stop: threading.Event):
        self.settings, self.job_id, self.control, self.stop = settings, job.job_id, control, stop
        self.recipe: Recipe = parse_recipe(job.recipe_json)
        self.recipe_json = job.recipe_json
        self.log = job_logger(log, job.job_id)
        self.buffer = replay_buffer_pb2_grpc.ReplayBufferStub(channel(settings.replay_buffer_addr))
        self.forecaster = forecaster_pb2_grpc.ForecasterStub(channel(settings.forecaster_addr))
        self.evaluator = generator_pb2_grpc.GeneratorStub(channel(settings.evaluator_addr))
        self.weights = make_transport(settings.weight_transport)
        self.publisher = Publisher(self.weights, job.job_id, self.recipe.pipeline.publish_in_background,
                                   on_sent=self.version_sent)
        self.validation_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="validation")
        self.pending_validations: list[Future] = []
        self.closed = threading.Event()
        self.step = 0
        self.checkpointed_step = 0
        self.version = 0
        self.learner_seconds = 0.0
        self.evaluator_seconds = 0.0
        self.last_pass_rate = -1.0
        self.compute_at_version: dict[int, common_pb2.ComputeSplit] = {}
        self.trained_entries: set[str] = set()
        self.exhausted = False
        """The prompt pool ran out (every prompt retired): the job ends before its budget."""
        # Unique per process: the buffer never hands a reader its own pending entries again, so a restarted
        # learner must be a new consumer to take over what its predecessor read and never acknowledged.
        self.consumer = f"learner-{settings.generator_id or 'main'}-{uuid.uuid4().hex[:8]}"
        self.status = "starting"

    # ---- compute accounting -------------------------------------------------------------------------------
    def compute_split(self) -> common_pb2.ComputeSplit:
        try:
            stats = self.buffer.GetStats(replay_buffer_pb2.GetStatsRequest(job_id=self.job_id), timeout=10)
            gen_seconds, tokens = stats.generator_device_seconds, stats.generated_tokens
        except grpc.RpcError:
            prev = self.compute_at_version.get(self.version)
            gen_seconds = prev.generator_device_hours * 3600 if prev else 0.0
            tokens = prev.generated_tokens if prev else 0
        split = common_pb2.ComputeSplit(learner_device_hours=self.learner_seconds / 3600,
                                        generator_device_hours=gen_seconds / 3600,
                                        evaluator_device_hours=self.evaluator_seconds / 3600,
                                        generated_tokens=tokens)
        for role, value in (("learner", split.learner_device_hours), ("generator", split.generator_device_hours),
                            ("evaluator", split.evaluator_device_hours)):
            metrics.COMPUTE.labels(self.job_id, role).set(value)
        return split

    @staticmethod
    def total(split: common_pb2.ComputeSplit) -> float:
        # The evaluator's hours are reported in the split but, as in the paper, not on the x-axis.
        return split.learner_device_hours + split.generator_device_hours

    # ---- model ----------------------------------------------------------------------------------------------
    def load(self) -> None:
        r = self.recipe
        torch.manual_seed(r.seed)
        self.ckpt_root = Path(self.settings.data_dir) / "checkpoints" / self.job_id
        self.validations = ValidationQueue(self.ckpt_root / "validations")
        resume = latest_checkpoint(self.ckpt_root)
        path = resume.path if resume else resolve_model_path(r.model.path, Path(self.settings.data_dir))
        self.open_model(path, resume)
        published = self.weights.latest_version(self.job_id)
        if resume:
            self.step, self.learner_seconds = resume.step, resume.learner_device_seconds
            self.checkpointed_step = resume.step
            self.log.info("resumed from %s", resume.path.name,
                          extra={"step": resume.step, "version": resume.policy_version})
        if resume and self.budget_reached():
            # Only finishing was left (e.g. the control plane was away when the budget was reached): no new
            # version, no training; the queued validations run and the job finishes.
            self.version = resume.policy_version
            return
        # Versions only increase, across restarts too: continue above anything already published.
        # The high-water mark on disk covers a weight-broadcast that restarted and forgot what it served.
        self.version = max(resume.policy_version if resume else 0, published + 1, self.published_high_water() + 1)
        self.publish(pinned=self.validate_at_step_zero())

    def open_model(self, path: Path, resume: ResumeState | None) -> None:
        """The model, tokenizer and trainer from `path` (the base model or the checkpoint resumed), with the
        optimizer and schedule state of `resume`."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        r = self.recipe
        self.device = resolve_device(r.learner.device)
        dtype = getattr(torch, r.model.resolved_dtype(cuda=self.device.type == "cuda"))
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model.train()
        self.trainer = Trainer(self.model, r, self.tokenizer.pad_token_id or 0, self.device)
        self.log.info("training on %s in %s", self.device, dtype)
        if resume:
            restore_trainer_state(resume.path, self.trainer.optimizer, self.trainer.scheduler)

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The current weights, full (what is published and validated)."""
        return self.model.state_dict()

    def train_step(self, groups: list[common_pb2.ScoredGroup]) -> dict[str, float]:
        return self.trainer.step(groups, self.version, stop=self.stop)

    def save_checkpoint(self) -> None:
        save_checkpoint(self.ckpt_root, self.model, self.tokenizer, self.trainer.optimizer, self.trainer.scheduler,
                        step=self.step, policy_version=self.version, learner_device_seconds=self.learner_seconds)

    def validate_at_step_zero(self) -> bool:
        return self.recipe.validation.at_step_zero and self.step == 0 and 0 not in self.validations.steps()

    def published_high_water(self) -> int:
        try:
            return int((self.ckpt_root / "published_version").read_text())
        except (OSError, ValueError):
            return -1

    def publish(self, pinned: bool = False, split: common_pb2.ComputeSplit | None = None) -> None:
        self.ckpt_root.mkdir(parents=True, exist_ok=True)
        (self.ckpt_root / "published_version").write_text(str(self.version))  # before generators can see it
        held = self.publisher.publish(self.version, self.policy_weights(), pinned=pinned)
        metrics.PUBLISH_HELD.labels(self.job_id).inc(held)
        self.compute_at_version[self.version] = split or self.compute_split()

    def version_sent(self, version: int, seconds: float) -> None:
        if self.closed.is_set():  # a send that outlived the job: its series are gone (forget_job)
            return
        metrics.PUBLISH_SECONDS.labels(self.job_id, self.weights.last_publish_sent_as).observe(seconds)
        metrics.VERSION.labels(self.job_id).set(version)

    # ---- validation -----------------------------------------------------------------------------------------
    def validate(self, version: int, step: int) -> None:
        """Queue `version` (the current weights) for validation; it is kept on disk until its point is on the
        curve."""
        queued = self.validations.add(version, step, self.compute_at_version[version], self.policy_weights())
        self.submit_validation(queued)

    def submit_validation(self, queued: QueuedValidation) -> None:
        self.pending_validations.append(self.validation_pool.submit(self.run_validation, queued))

    def run_validation(self, queued: QueuedValidation) -> None:
        """Evaluate the pinned version on the iid validation split and on every downstream eval set, adding each
        point to its curve; every call is retried while its service is away. A version the transport no longer
        holds is re-published (pinned) from the queue's copy. The version leaves the queue once all its points
        are on their curves."""
        version, step = queued.version, queued.step
        extra = {"step": step, "version": version}
        deadline = time.monotonic() + VALIDATION_DEADLINE_S
        self.publisher.wait_sent(version, timeout=VALIDATION_DEADLINE_S)  # else the evaluator asks for it too soon

        def retry(what: str, err: grpc.RpcError) -> bool:
            if err.code() in VALIDATION_FINAL_CODES or time.monotonic() > deadline:
                self.log.error("validation abandoned (%s): %s", what, err.details(), extra=extra)
                return False
            self.log.warning("validation: %s failed (%s); retrying", what, err.code().name, extra=extra)
            return not self.closed.wait(2.0) and not self.stop.is_set()

        for evaluation in evaluations(self.recipe.validation):
            request = generator_pb2.EvaluateRequest(
                job_id=self.job_id, policy_version=version, num_prompts=evaluation.num_prompts,
                samples_per_prompt=evaluation.samples_per_prompt, eval_set=evaluation.eval_set)
            while True:
                try:
                    resp = self.evaluator.Evaluate(request, timeout=1800)
                    break
                except grpc.RpcError as err:
                    if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        # e.g. "job has no version N": the evaluator took the pin and died, or weight-broadcast
                        # restarted (the evaluator reports its fetch's NOT_FOUND as INTERNAL)
                        self.republish(queued)
                    if not retry("evaluation", err):
                        return
            self.evaluator_seconds += resp.device_seconds
            if not evaluation.eval_set:
                self.last_pass_rate = resp.pass_rate
                metrics.PASS_RATE.labels(self.job_id).set(resp.pass_rate)
            point = common_pb2.ValidationPoint(
                job_id=self.job_id, step=step, policy_version=version, compute=self.total(queued.split),
                value=resp.pass_rate, split=queued.split, num_prompts=resp.num_prompts,
                samples_per_prompt=resp.samples_per_prompt)
            add = forecaster_pb2.AddPointRequest(point=point, recipe_json=self.recipe_json,
                                                 eval_set=evaluation.eval_set)
            while True:
                try:
                    self.forecaster.AddPoint(add, timeout=60)
                    break
                except grpc.RpcError as err:
                    if not retry("adding the point", err):
                        return
            self.log.info("validation pass rate %.3f on %s at %.5f device-hours", resp.pass_rate,
                          evaluation.eval_set or "iid", point.compute, extra=extra)
        self.validations.done(version)

    def republish(self, queued: QueuedValidation) -> None:
        """Publish a queued version again, pinned, from the queue's copy of its weights."""
        try:
            weights = self.validations.weights(self.job_id, queued.version)
            self.publisher.republish(queued.version, dict(weights.named_tensors()), pinned=True)
            self.log.info("re-published for validation", extra={"step": queued.step, "version": queued.version})
        except Exception as err:  # noqa: BLE001 - the evaluation is retried either way
            self.log.warning("could not re-publish for validation: %s", err,
                             extra={"step": queued.step, "version": queued.version})

    # ---- training ---------------------------------------------------------------------------------------------
    def next_batch(self) -> tuple[list[common_pb2.ScoredGroup], list[str]]:
        need = self.recipe.pipeline.prompts_per_batch
        groups: list[common_pb2.ScoredGroup] = []
        entries: list[str] = []
        in_batch: set[str] = set()  # entry ids and group ids: a batch never holds one group twice
        started = waited_since = time.monotonic()
        while len(groups) < need:
            if self.stop.is_set():
                raise JobCancelled("learner stopping")
            resp = self.buffer.ReadBatch(replay_buffer_pb2.ReadBatchRequest(
                job_id=self.job_id, consumer=self.consumer, max_groups=need - len(groups),
                learner_version=self.version, block_ms=1000), timeout=30)
            for item in resp.groups:
                if item.entry_id in self.trained_entries:  # redelivered after we trained on it: skip
                    continue
                if item.entry_id in in_batch or item.group.group_id in in_batch:
                    continue
                in_batch.update((item.entry_id, item.group.group_id))
                groups.append(item.group)
                entries.append(item.entry_id)
            if not resp.groups and time.monotonic() - waited_since > 5:
                if self.pool_exhausted(len(groups)):
                    self.exhausted = True
                    self.log.warning("prompt pool exhausted: every training prompt is retired "
                                     "(No-Positive-Resampling) and nothing is left to read", extra={"step": self.step})
                    break
                if not self.control.report(self.progress()):
                    raise JobCancelled("job no longer running")
                waited_since = time.monotonic()
        metrics.STARVED.labels(self.job_id).inc(time.monotonic() - started)
        return groups, entries

    def pool_exhausted(self, in_hand: int) -> bool:
        """No group can come any more: every prompt retired, none leased, nothing in the stream but ours."""
        try:
            st = self.buffer.GetStats(replay_buffer_pb2.GetStatsRequest(job_id=self.job_id), timeout=10)
        except grpc.RpcError:
            return False
        return st.pool_size == 0 and st.leased == 0 and st.pending <= in_hand

    def progress(self, split: common_pb2.ComputeSplit | None = None) -> control_plane_pb2.JobProgress:
        return control_plane_pb2.JobProgress(job_id=self.job_id, step=self.step, policy_version=self.version,
                                             compute=split or self.compute_split(), last_pass_rate=self.last_pass_rate)

    def budget_reached(self, split: common_pb2.ComputeSplit | None = None) -> bool:
        b = self.recipe.budget
        if b.max_steps is not None and self.step >= b.max_steps:
            return True
        return (b.compute_device_hours is not None
                and self.total(split or self.compute_split()) >= b.compute_device_hours)

    def run(self) -> None:
        r = self.recipe
        self.load()
        if r.budget.compute_device_hours:
            metrics.BUDGET.labels(self.job_id).set(r.budget.compute_device_hours)
        for queued in self.validations.queued():  # what a predecessor queued and did not see on the curve
            self.submit_validation(queued)
        if self.validate_at_step_zero():
            self.validate(self.version, 0)
        publish_every = max(r.pipeline.max_staleness, 1) if r.pipeline.mode is PipelineMode.ppo_off_policy else 1
        self.status = "training"
        done = self.budget_reached()
        try:
            while not done:
                groups, entries = self.next_batch()  # short of a batch only when the pool is exhausted
                if not groups:
                    break
                started = time.monotonic()
                stats = self.train_step(groups)
                self.step += 1
                self.learner_seconds += (time.monotonic() - started) * self.devices
                split = self.compute_split()  # one buffer round trip per step: budget, publish, progress
                done = self.budget_reached(split) or self.exhausted
                validate_now = done or self.step % r.validation.every_steps == 0
                if validate_now or self.step % publish_every == 0:
                    self.version += 1
                    self.publish(pinned=validate_now, split=split)  # pinned: kept until the evaluator fetched it
                self.buffer.Ack(replay_buffer_pb2.AckRequest(job_id=self.job_id, entry_ids=entries, trained=True),
                                timeout=30)
                self.trained_entries.update(entries)
                elapsed = time.monotonic() - started
                metrics.STEP.labels(self.job_id).set(self.step)
                metrics.STEP_SECONDS.labels(self.job_id).observe(elapsed)
                metrics.LAST_STEP.labels(self.job_id).set(time.time())
                metrics.LOSS.labels(self.job_id).set(stats["loss"])
                metrics.TOKENS.labels(self.job_id).inc(stats["tokens"])
                metrics.SAMPLER_KL.labels(self.job_id).set(stats["approx_kl"])
                metrics.LEARNING_RATE.labels(self.job_id).set(stats["lr"])
                metrics.MAX_IMPORTANCE_RATIO.labels(self.job_id).set(stats["max_ratio"])
                metrics.CLIPPED_TOKEN_RATIO.labels(self.job_id).set(stats["clip_fraction"])
                self.log.info("trained: loss %.4f reward %.3f tokens %d lag<=%d sampler-KL %.2e lr %.2e (%.2fs)",
                              stats["loss"], stats["mean_reward"], stats["tokens"], stats["max_version_lag"],
                              stats["approx_kl"], stats["lr"], elapsed,
                              extra={"step": self.step, "version": self.version})
                if validate_now and self.step not in self.validations.steps():  # a step retrained after a resume
                    self.validate(self.version, self.step)
                if self.step % r.budget.checkpoint_every_steps == 0:
                    self.checkpoint()
                if not self.control.report(self.progress(split)):
                    raise JobCancelled("job no longer running")
                if self.stop.is_set():
                    raise JobCancelled("learner stopping")
        except StepInterrupted as err:  # stopping: the step's micro-batches were abandoned, its groups unacked
            self.checkpoint_on_stop()
            raise JobCancelled("learner stopping mid-step") from err
        except JobCancelled:
            if self.stop.is_set():  # SIGTERM: keep what was trained (the process waits drain_timeout_s for this)
                self.checkpoint_on_stop()
            raise
        if self.exhausted and self.step not in self.validations.steps():  # the last version's point
            self.version += 1
            self.publish(pinned=True)
            self.validate(self.version, self.step)
        self.publisher.flush()
        self.checkpoint()
        self.status = "validating"
        for future in self.pending_validations:
            future.result()
        self.control.report(self.progress())
        reason = (f"prompt pool exhausted at step {self.step}: every training prompt was retired by "
                  "No-Positive-Resampling (data.no_positive_resampling_threshold)" if self.exhausted
                  else f"budget reached at step {self.step}")
        try:
            self.control.finish(self.job_id, "succeeded", reason)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # ended already: cancelled meanwhile, or our retried FinishJob's first answer was lost
            self.log.warning("not finished as succeeded: %s", err.details())

    def checkpoint_on_stop(self) -> None:
        if self.step > self.checkpointed_step:
            self.checkpoint()
            self.log.info("checkpointed on stop", extra={"step": self.step, "version": self.version})

    def checkpoint(self) -> None:
        self.checkpointed_step = self.step
        self.save_checkpoint()

    def close(self) -> None:
        self.closed.set()
        self.validation_pool.shutdown(wait=False, cancel_futures=True)
        if self.publisher.close(timeout=PUBLISH_CLOSE_TIMEOUT_S):  # never close a transport that is still sending
            self.weights.close()
