"""The generator's job loop: lease prompts → sample G completions per prompt on vLLM → grade → write groups,
with many groups in flight and weights applied in flight as the learner publishes them. In the evaluator role
it instead answers Evaluate for one pinned policy version."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from pathlib import Path

import grpc

from scalerl import errors
from scalerl.logs import job_logger
from scalerl.prompts import prompt_token_ids, stop_token_ids
from scalerl.recipe import EvalSetConfig, Recipe, eval_set_split, parse_recipe
from scalerl.serving import channel
from scalerl.settings import Settings
from scalerl.tasks import build_prompts
from scalerl.v1 import (common_pb2, generator_pb2, replay_buffer_pb2, replay_buffer_pb2_grpc, reward_grader_pb2,
                        reward_grader_pb2_grpc)
from scalerl_generator import metrics
from scalerl_generator.coalesce import Coalescer
from scalerl.weights import ReceivedWeights, make_transport
from scalerl_generator.engine import EngineDeadError, GenerationEngine, SampledCompletion

log = logging.getLogger(__name__)

FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH,
          "interrupted": common_pb2.FINISH_REASON_INTERRUPTED, "aborted": common_pb2.FINISH_REASON_ABORTED}


def to_completion(c: SampledCompletion) -> common_pb2.Completion:
    return common_pb2.Completion(
        token_ids=c.token_ids, logprobs=c.logprobs, loss_mask=c.loss_mask, text=c.text,
        finish_reason=FINISH.get(c.finish_reason, common_pb2.FINISH_REASON_UNSPECIFIED),
        versions=[common_pb2.VersionSpan(version=v, start=s, end=e) for v, s, e in c.versions])


class BusyClock:
    """Device-seconds: wall time during which at least one generation is running on this replica."""

    def __init__(self):
        self.active = 0
        self.since = 0.0
        self.accounted = 0.0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            if self.active == 0:
                self.since = time.monotonic()
            self.active += 1

    def exit(self) -> None:
        with self.lock:
            self.active -= 1
            if self.active == 0:
                self.accounted += time.monotonic() - self.since

    def take(self) -> float:
        """Busy seconds since the last take (attributed to the group being written)."""
        with self.lock:
            now = time.monotonic()
            total = self.accounted + (now - self.since if self.active else 0.0)
            if self.active:
                self.since = now
            self.accounted = 0.0
            return total


class JobWorker:
    def __init__(self, settings: Settings, job: common_pb2.Job, stop: threading.Event, generator_id: str):
        self.settings, self.job_id, self.stop = settings, job.job_id, stop
        self.recipe: Recipe = parse_recipe(job.recipe_json)
        self.generator_id = generator_id
        self.log = job_logger(log, self.job_id)
        self.buffer = replay_buffer_pb2_grpc.ReplayBufferStub(channel(settings.replay_buffer_addr))
        self.grader = reward_grader_pb2_grpc.RewardGraderStub(channel(settings.reward_grader_addr))
        self.weights = make_transport(settings.weight_transport)
        self.engine: GenerationEngine | None = None
        self.stop_token_ids: list[int] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.clock = BusyClock()
        self.in_flight_versions: dict[str, int] = {}
        self.held_leases: dict[str, str] = {}  # prompt_id -> lease_id, for every prompt still being worked on
        self._validation_prompts: dict[str, list] = {}
        self.tokens = 0
        self.update_lock: asyncio.Lock | None = None
        # One Grade and one WriteGroups call in flight at a time, carrying every group finished meanwhile.
        self.grading = Coalescer(self._grade_items, max_items=256)
        self.writing = Coalescer(self._write_groups, max_items=64)

    def _grade_items(self, items: list) -> list:
        request = reward_grader_pb2.GradeRequest(job_id=self.job_id, items=items)
        return list(self.grader.Grade(request, timeout=120).results)

    def _write_groups(self, groups: list) -> list:
        self.buffer.WriteGroups(replay_buffer_pb2.WriteGroupsRequest(groups=groups), timeout=60)
        return [None] * len(groups)

    async def start_engine(self) -> None:
        from scalerl.models import resolve_model_path

        r = self.recipe
        path = resolve_model_path(r.model.path, Path(self.settings.data_dir))
        import torch

        self.engine = GenerationEngine(str(path), seed=r.seed, max_model_len=r.model.max_model_len,
                                       fp32_lm_head=r.model.fp32_lm_head,
                                       dtype=r.model.resolved_dtype(cuda=torch.cuda.is_available()),
                                       **self.settings.engine.model_dump())
        await self.engine.start()
        self.tokenizer = self.engine.tokenizer
        # EOS and, for a chat model, the template's end-of-turn token: a reply ends where the template ends it.
        self.stop_token_ids = stop_token_ids(self.tokenizer, r.prompt)
        self.loop = asyncio.get_running_loop()
        self.update_lock = asyncio.Lock()

    async def apply_weights(self, weights: ReceivedWeights, pinned: bool = False) -> float:
        """Load a received version in flight (its named tensors end up in vLLM's workers). Rollouts only move
        forward; the evaluator loads exactly the pinned one."""
        assert self.engine is not None
        version = weights.version
        async with self.update_lock:
            if version < self.engine.current_version and not pinned:
                return 0.0
            pause = await self.engine.update_weights(weights, version, self.recipe.pipeline.kv_cache_on_update.value)
        metrics.PAUSE.labels(self.job_id).observe(pause)
        metrics.POLICY_VERSION.labels(self.job_id, self.generator_id).set(version)
        self.log.info("weights applied in flight (pause %.3fs)", pause, extra={"version": version})
        return pause

    # ---- rollout role -----------------------------------------------------------------------------------------
    def subscribe_weights(self) -> None:
        """Thread: receives each newer version and applies it in flight on the engine's event loop."""
        for received in self.weights.subscribe(self.job_id, self.engine.current_version, self.stop):
            future = asyncio.run_coroutine_threadsafe(self.apply_weights(received), self.loop)
            try:
                future.result(timeout=600)
            except Exception:
                self.log.exception("weights failed to load; keeping v%d", self.engine.current_version,
                                   extra={"version": received.version})

    def sampling_kwargs(self, prompt_len: int) -> dict:
        g = self.recipe.generation
        room = self.recipe.model.max_model_len - prompt_len
        max_tokens = max(1, min(room, g.thinking_budget_high + g.solution_budget))
        kwargs = dict(temperature=g.temperature, top_p=g.top_p, max_tokens=max_tokens,
                      stop_token_ids=self.stop_token_ids or None)
        if g.forced_interruption and g.thinking_budget_low < max_tokens:
            kwargs.update(thinking_budget=(g.thinking_budget_low, g.thinking_budget_high),
                          solution_budget=g.solution_budget, interruption_phrase=g.interruption_phrase)
        return kwargs

    async def grade(self, prompt: common_pb2.Prompt, completions: list[SampledCompletion]):
        items = [reward_grader_pb2.GradeItem(task=prompt.task, answer=prompt.answer, response=c.text,
                                             metadata_json=prompt.metadata_json) for c in completions]
        try:
            return await self.grading.submit(items)
        except grpc.RpcError as err:  # the grader is down: the group is failed-to-grade, not reward 0
            return [reward_grader_pb2.GradeResult(status=common_pb2.GRADE_STATUS_FAILED, error=err.code().name)
                    for _ in completions]

    async def one_group(self, prompt: common_pb2.Prompt, lease_id: str) -> None:
        self.held_leases[prompt.prompt_id] = lease_id
        try:
            await self._one_group(prompt, lease_id)
        finally:
            self.held_leases.pop(prompt.prompt_id, None)

    def prompt_ids(self, text: str) -> list[int]:
        """The ids sampled from and written with the group: the learner trains on exactly these."""
        return prompt_token_ids(self.tokenizer, text, self.recipe.prompt)

    async def _one_group(self, prompt: common_pb2.Prompt, lease_id: str) -> None:
        G = self.recipe.pipeline.generations_per_prompt
        prompt_ids = self.prompt_ids(prompt.text)
        group_id = uuid.uuid4().hex
        metrics.IN_FLIGHT.labels(self.job_id, self.generator_id).inc()
        self.in_flight_versions[group_id] = self.engine.current_version
        self.clock.enter()
        try:
            completions = await self.engine.generate(prompt_ids, G, request_id=group_id,
                                                     **self.sampling_kwargs(len(prompt_ids)))
        finally:
            self.clock.exit()
            self.in_flight_versions.pop(group_id, None)
            metrics.IN_FLIGHT.labels(self.job_id, self.generator_id).dec()
        results = await self.grade(prompt, completions)
        n_tokens = sum(len(c.token_ids) for c in completions)
        self.tokens += n_tokens
        metrics.TOKENS.labels(self.job_id, self.generator_id).inc(n_tokens)
        for c in completions:
            metrics.COMPLETIONS.labels(self.job_id, c.finish_reason).inc()
            if c.finish_reason == "interrupted":
                metrics.INTERRUPTIONS.labels(self.job_id).inc()
        group = common_pb2.ScoredGroup(
            job_id=self.job_id, group_id=group_id, prompt=prompt, prompt_token_ids=prompt_ids,
            generator_id=self.generator_id, device_seconds=self.clock.take(), lease_id=lease_id,
            completions=[common_pb2.ScoredCompletion(completion=to_completion(c), reward=res.reward,
                                                     grade_status=res.status, grade_error=res.error)
                         for c, res in zip(completions, results)])
        await self.writing.submit([group])

    def update_lag_metric(self) -> None:
        oldest = min(self.in_flight_versions.values(), default=self.engine.current_version)
        metrics.VERSION_LAG.labels(self.job_id, self.generator_id).set(self.engine.current_version - oldest)

    def renew_leases(self) -> None:
        """Extend the leases of the prompts still in flight (generation, grading or the write), so a long
        generation never has its prompt leased again; a lease already lost is logged (its write is refused)."""
        by_lease: dict[str, list[str]] = {}
        for prompt_id, lease_id in list(self.held_leases.items()):
            by_lease.setdefault(lease_id, []).append(prompt_id)
        for lease_id, prompt_ids in by_lease.items():
            if not lease_id:
                continue
            resp = self.buffer.RenewLeases(replay_buffer_pb2.RenewLeasesRequest(
                job_id=self.job_id, lease_id=lease_id, prompt_ids=prompt_ids,
                lease_seconds=self.recipe.data.lease_seconds), timeout=30)
            if resp.lost_prompt_ids:
                metrics.LEASES_LOST.labels(self.job_id, self.generator_id).inc(len(resp.lost_prompt_ids))
                self.log.warning("%d leases lost before their groups were written", len(resp.lost_prompt_ids))

    async def renew_leases_loop(self) -> None:
        """Renew three times per lease period (a missed renewal or two still leaves the lease alive)."""
        period = self.recipe.data.lease_seconds / 3
        while not self.stop.is_set():
            await asyncio.sleep(period)
            try:
                await asyncio.to_thread(self.renew_leases)
            except grpc.RpcError as err:
                self.log.warning("lease renewal failed: %s", err.code().name)

    async def rollout_loop(self, max_in_flight: int) -> None:
        # PPO-off-policy-k: the buffer grants at most k * prompts_per_batch prompts per frozen learner version
        # (slow_down until the learner publishes), so nothing is needed here beyond honouring slow_down.
        tasks: set[asyncio.Task] = set()
        renewer = asyncio.create_task(self.renew_leases_loop())
        try:
            while not self.stop.is_set():
                if not self.engine.alive:  # fail the job loop so a fresh engine is built, not every group forever
                    raise EngineDeadError(f"job {self.job_id}: the vLLM engine stopped")
                self.update_lag_metric()
                free = max_in_flight - len(tasks)
                if free <= 0:
                    await self._wait_any(tasks)
                    continue
                try:
                    lease = await asyncio.to_thread(self.buffer.LeasePrompts, replay_buffer_pb2.LeasePromptsRequest(
                        job_id=self.job_id, generator_id=self.generator_id, max_prompts=free,
                        lease_seconds=self.recipe.data.lease_seconds), timeout=30)
                except grpc.RpcError as err:
                    if err.code() == grpc.StatusCode.NOT_FOUND:  # the job ended and the buffer dropped it
                        self.log.info("the buffer no longer knows the job; rollouts stop")
                        return
                    raise
                # A partial grant (slow_down with prompts) is used: those prompts are leased to us and count toward
                # the buffer's backpressure until written.
                for prompt in lease.prompts:
                    tasks.add(asyncio.create_task(self.one_group(prompt, lease.lease_id)))
                if lease.slow_down or not lease.prompts:
                    wait = lease.retry_after_s or 0.5
                    started = time.monotonic()
                    await self._wait_any(tasks, asyncio.sleep(wait))
                    metrics.IDLE.labels(self.job_id, self.generator_id).inc(time.monotonic() - started)
        finally:
            renewer.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    async def _wait_any(tasks: set[asyncio.Task], extra=None) -> None:
        waiters = set(tasks)
        extra_task = asyncio.ensure_future(extra) if extra is not None else None
        if extra_task is not None:
            waiters.add(extra_task)
        if not waiters:
            return
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task in tasks:
                tasks.discard(task)
                if not task.cancelled() and task.exception() is not None:
                    log.error("group failed: %r", task.exception())
        if extra_task is not None and not extra_task.done():
            extra_task.cancel()

    # ---- evaluator role ---------------------------------------------------------------------------------------
    def eval_set(self, name: str) -> EvalSetConfig | None:
        """The recipe's downstream eval set called `name`, if any."""
        return next((s for s in self.recipe.validation.eval_sets if s.set_name == name), None)

    def validation_prompts(self, eval_set: str, num_prompts: int) -> list:
        """The held-out split of the job's task ("") or a downstream eval set's prompts (a registered task's
        validation split, or every record of a file set), built once per job and set (reasoning-gym sets are not
        free to regenerate)."""
        if eval_set not in self._validation_prompts:
            if eval_set:
                s = self.eval_set(eval_set)
                prompts = build_prompts(s.task_config(self.recipe.task.seed), eval_set_split(s.task))
            else:
                prompts = build_prompts(self.recipe.task, "validation")
            self._validation_prompts[eval_set] = prompts
        return self._validation_prompts[eval_set][:num_prompts]

    async def evaluate(self, version: int, num_prompts: int, samples: int,
                       eval_set: str = "") -> generator_pb2.EvaluateResponse:
        started = time.monotonic()
        prompts = await asyncio.to_thread(self.validation_prompts, eval_set, num_prompts)
        received = await asyncio.to_thread(self.weights.fetch, self.job_id, version, True)
        await self.apply_weights(received, pinned=True)

        async def one(p) -> list:
            ids = self.prompt_ids(p.text)
            completions = await self.engine.generate(ids, samples, **self.sampling_kwargs(len(ids)))
            prompt = common_pb2.Prompt(job_id=self.job_id, prompt_id=p.prompt_id, text=p.text, task=p.task,
                                       answer=p.answer, metadata_json=p.metadata_json)
            return await self.grade(prompt, completions)

        results = [r for rs in await asyncio.gather(*(one(p) for p in prompts)) for r in rs]
        # A completion the grader failed on says nothing about the policy: out of the denominator, not a 0.
        rewards = [r.reward for r in results if r.status == common_pb2.GRADE_STATUS_GRADED]
        failed = len(results) - len(rewards)
        if not rewards:
            raise errors.Unavailable(f"all {failed} completions of version {version} failed to grade",
                                     job_id=self.job_id)
        if failed:
            self.log.warning("%d of %d validation completions failed to grade", failed, len(results),
                             extra={"version": version})
        return generator_pb2.EvaluateResponse(job_id=self.job_id, policy_version=version,
                                              pass_rate=sum(rewards) / len(rewards), num_prompts=len(prompts),
                                              samples_per_prompt=samples, device_seconds=time.monotonic() - started,
                                              completions_graded=len(rewards), completions_failed_to_grade=failed)

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.shutdown()
        self.weights.close()
