"""The learner service across torchrun ranks (FSDP2): `torchrun --nproc-per-node N -m scalerl_learner.ranks`.

Rank 0 is the learner service (gRPC, the job protocol: batches from the buffer, publishing, validation, progress);
every other rank follows its commands. Each command that touches the sharded model is a collective: rank 0
broadcasts it (:class:`Command`), then every rank runs the same code on its shard:

* ``open``: build the model from the base or the resumed checkpoint, shard it, load the sharded optimizer state;
* ``step``: one optimizer step on rank 0's batch (:class:`~scalerl_learner.distributed.DistributedTrainer`);
* ``gather``: full weights onto rank 0 (publishing, validation);
* ``checkpoint``: the HF weights (rank 0) and a ``torch.distributed.checkpoint`` of model + optimizer (every
  rank), resumable on another world size;
* ``close`` (the job ended) and ``exit``.

A rank that dies takes the group down: torchrun stops the others and exits, and whoever restarts the learner
(Kubernetes, the local supervisor) starts a new group that resumes the job from its last checkpoint. A failed
collective therefore never fails the job: rank 0 exits without reporting (:class:`RankLost`).
Multi-node checkpoints need a data volume every node mounts (ReadWriteMany).
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from scalerl.recipe import Recipe, parse_recipe
from scalerl.v1 import common_pb2
from scalerl_learner.checkpoint import ResumeState, write_checkpoint
from scalerl_learner.runner import JobRunner
from scalerl_learner.trainer import resolve_device

log = logging.getLogger(__name__)

SHARDED_STATE = "sharded_state"
"""The DCP directory inside a checkpoint written by ranks (model + optimizer + LR schedule)."""
# Followers wait in a broadcast while rank 0 waits for a job: a collective must outlive any idle period.
IDLE_TIMEOUT = datetime.timedelta(days=30)


class RankLost(Exception):
    """A collective failed: another rank is gone. The group must restart; the job is not failed."""


@dataclass
class Command:
    op: str
    args: dict = field(default_factory=dict)


def broadcast(command: Command | None) -> Command:
    """Rank 0's command on every rank (others pass None)."""
    payload = [command]
    try:
        dist.broadcast_object_list(payload, src=0)
    except RuntimeError as err:  # nothing of the job runs in a broadcast: any failure is a lost peer
        raise RankLost(f"broadcast failed: {err}") from err
    return payload[0]


class ShardedModel:
    """One rank's share of the job's model: the same calls on every rank, in the same order."""

    def __init__(self, recipe: Recipe, path: str, resume: str | None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from scalerl_learner.distributed import DistributedTrainer, load_sharded

        self.recipe = recipe
        self.device = resolve_device(recipe.learner.device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
        dtype = getattr(torch, recipe.model.resolved_dtype(cuda=self.device.type == "cuda"))
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model.train()
        self.trainer = DistributedTrainer(self.model, recipe, self.tokenizer.pad_token_id or 0, self.device)
        if resume:
            load_sharded(Path(resume) / SHARDED_STATE, self.model, self.trainer.optimizer, self.trainer.scheduler)

    def step(self, groups: list[common_pb2.ScoredGroup], version: int) -> dict[str, float]:
        return self.trainer.step(groups, version)

    def gather(self) -> dict[str, torch.Tensor]:
        from scalerl_learner.distributed import full_state_dict

        return full_state_dict(self.model)

    def save(self, tmp: Path) -> None:
        """Every rank writes its shards; rank 0 also the HF weights and tokenizer (loadable by transformers and
        vLLM, and the base of a resume)."""
        from scalerl_learner.distributed import save_sharded

        full = self.gather()
        if dist.get_rank() == 0:
            self.model.save_pretrained(tmp, state_dict=full, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
        save_sharded(tmp / SHARDED_STATE, self.model, self.trainer.optimizer, self.trainer.scheduler)


def run(sharded: ShardedModel | None, command: Command) -> ShardedModel | None:
    """One command on this rank; returns the rank's model afterwards."""
    a = command.args
    try:
        if command.op == "open":
            return ShardedModel(parse_recipe(a["recipe_json"]), a["path"], a.get("resume"))
        if command.op == "close":
            return None
        assert sharded is not None, f"{command.op} before open"
        if command.op == "step":
            groups = [common_pb2.ScoredGroup.FromString(b) for b in a["groups"]]
            sharded.stats = sharded.step(groups, a["version"])
        elif command.op == "gather":
            sharded.weights = sharded.gather()
        elif command.op == "checkpoint":
            sharded.save(Path(a["tmp"]))
        else:
            raise ValueError(f"unknown command {command.op!r}")
    except RuntimeError as err:
        if is_collective_failure(err):
            raise RankLost(f"{command.op}: {err}") from err
        raise
    return sharded


def is_collective_failure(err: BaseException) -> bool:
    """A peer is gone (NCCL reports DistBackendError; gloo a RuntimeError about the connection), as opposed to
    an error in the job's own computation, which fails the job."""
    text = str(err)
    return isinstance(err, dist.DistBackendError) or any(
        marker in text for marker in ("Connection closed by peer", "Connection reset by peer", "Gloo", "NCCL"))


class RanksJobRunner(JobRunner):
    """The job on rank 0, every model operation run by all ranks."""

    FATAL = (RankLost,)
    sharded: ShardedModel | None = None
    _gathered: tuple[int, dict] | None = None

    @property
    def devices(self) -> int:
        return dist.get_world_size()

    def command(self, op: str, **args) -> ShardedModel | None:
        cmd = broadcast(Command(op, args))
        self.sharded = run(self.sharded, cmd)
        return self.sharded

    def open_model(self, path: Path, resume: ResumeState | None) -> None:
        if resume and not (resume.path / SHARDED_STATE).is_dir():
            raise RuntimeError(f"checkpoint {resume.path} was written by one process, not by ranks: resume it with "
                               "`scalerl-serve learner`")
        sharded = self.command("open", recipe_json=self.recipe_json, path=str(path),
                               resume=str(resume.path) if resume else None)
        self.model, self.tokenizer, self.trainer, self.device = (sharded.model, sharded.tokenizer, sharded.trainer,
                                                                 sharded.device)
        self.log.info("training on %d ranks (%s) in %s", dist.get_world_size(), self.device,
                      next(self.model.parameters()).dtype)

    def policy_weights(self) -> dict[str, torch.Tensor]:
        if self._gathered is None or self._gathered[0] != self.step:  # publish and validate share one gather
            self._gathered = (self.step, self.command("gather").weights)
        return self._gathered[1]

    def train_step(self, groups: list[common_pb2.ScoredGroup]) -> dict[str, float]:
        return self.command("step", groups=[g.SerializeToString() for g in groups], version=self.version).stats

    def save_checkpoint(self) -> None:
        write_checkpoint(self.ckpt_root, lambda tmp: self.command("checkpoint", tmp=str(tmp)), step=self.step,
                         policy_version=self.version, learner_device_seconds=self.learner_seconds,
                         world_size=dist.get_world_size())

    def close(self) -> None:
        try:
            if self.sharded is not None:
                self.command("close")
        finally:
            super().close()


def follow() -> None:
    """Ranks > 0: run rank 0's commands until it says exit."""
    sharded = None
    while True:
        command = broadcast(None)
        if command.op == "exit":
            return
        try:
            sharded = run(sharded, command)
        except RankLost:
            raise
        except Exception:  # the job's own error, the same on rank 0, which fails the job and sends close
            log.exception("command %s failed", command.op)
            sharded = None


def main() -> None:
    from scalerl.logs import setup_logging
    from scalerl.settings import Settings

    settings = Settings(service="learner")
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(f"learner-rank{rank}", settings.log_level, settings.log_json)
    torch.set_num_threads(settings.torch_threads)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=IDLE_TIMEOUT)
    try:
        if rank == 0:
            serve_rank0(settings)
        else:
            # torchrun passes SIGTERM to every rank; only rank 0 decides when the group stops (after its
            # checkpoint on stop, which needs every rank).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            follow()
    except RankLost as err:
        log.error("rank %d: %s; exiting so that the group restarts and resumes the job", rank, err)
        os._exit(1)
    dist.destroy_process_group()


def serve_rank0(settings) -> None:
    from scalerl.serving import ServiceRegistration, run_service
    from scalerl.v1 import learner_pb2_grpc
    from scalerl_learner.main import work_loop
    from scalerl_learner.service import LearnerService

    service = LearnerService()
    registration = ServiceRegistration(["scalerl.v1.Learner"],
                                       lambda s: learner_pb2_grpc.add_LearnerServicer_to_server(service, s))

    def background(stop: threading.Event) -> None:
        try:
            work_loop(settings, service, stop, runner_cls=RanksJobRunner)
        except RankLost as err:
            log.error("%s; exiting so that the group restarts and resumes the job", err)
            os._exit(1)
        broadcast(Command("exit"))

    run_service(settings, registration, background=background)


if __name__ == "__main__":
    main()
