"""The learner across ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``), launched by torchrun.

* Every decoder layer is a shard unit; the root unit holds the embeddings, final norm and LM head. The model is
  called through :class:`Scorer`, a module whose forward is :func:`~scalerl_learner.batch.output_logprobs`, so
  the root's all-gather / reduce-scatter hooks wrap the body *and* the chunked FP32 head.
* Data parallel over micro-batches: rank r takes micro-batches r, r + W, ...; every rank runs the same number
  of forward/backward passes (a rank short of work runs a zero-weight one: FSDP's collectives are in
  lockstep). The per-token weights are the whole batch's (:func:`~scalerl_learner.losses.aggregation_weights`),
  so the summed gradient is the single-process gradient; FSDP averages over ranks, hence the factor W.
* Rank 0 reads the batch (it speaks the job protocol) and :func:`broadcast_groups` hands it to the others.
* Publishing needs full weights: :func:`full_state_dict` gathers them onto rank 0 (CPU). Checkpoints are
  ``torch.distributed.checkpoint`` directories (:func:`save_sharded` / :func:`load_sharded`), which load on a
  different world size.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard

from scalerl.recipe import Recipe
from scalerl.v1 import common_pb2
from scalerl_learner.batch import TrainBatch, micro_batches, output_logprobs, select_rows
from scalerl_learner.losses import (LossOutput, aggregation_weights, compute_advantages, policy_loss,
                                    weighted_policy_loss)
from scalerl_learner.optim import build_optimizer, build_scheduler
from scalerl_learner.trainer import Trainer


def init_process_group() -> tuple[int, int]:
    """Join torchrun's group (NCCL on CUDA, else gloo); returns (rank, world size)."""
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return dist.get_rank(), dist.get_world_size()


class Scorer(nn.Module):
    """The FSDP root: forward = the learner's log-probs of a micro-batch (body + chunked head)."""

    def __init__(self, model: nn.Module, options):
        super().__init__()
        self.model, self.options = model, options

    def forward(self, batch: TrainBatch) -> torch.Tensor:
        return output_logprobs(self.model, batch, self.options)


def shard(model: nn.Module, options) -> Scorer:
    for layer in model.get_decoder().layers:
        fully_shard(layer)
    scorer = Scorer(model, options)
    fully_shard(scorer)
    return scorer


def broadcast_groups(groups: list[common_pb2.ScoredGroup] | None) -> list[common_pb2.ScoredGroup]:
    """Rank 0's groups on every rank (others pass None)."""
    payload = [[g.SerializeToString() for g in groups] if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(payload, src=0)
    return [common_pb2.ScoredGroup.FromString(b) for b in payload[0]]


class DistributedTrainer(Trainer):
    """Trainer whose model is sharded over the process group; same step, same results."""

    def __init__(self, model, recipe: Recipe, pad_id: int, device: torch.device | str = "cpu"):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        super().__init__(model, recipe, pad_id, device)  # before sharding: activation checkpointing, options
        self.scorer = shard(model, self.logprob_options)
        # the optimizer must hold the sharded (DTensor) parameters
        self.optimizer = build_optimizer(model, recipe.optimizer)
        self.scheduler = build_scheduler(self.optimizer, recipe.optimizer)

    def accumulate(self, batch: TrainBatch, micro_batch_tokens: int | None = None,
                   stop=None) -> tuple[LossOutput, int]:
        # `stop` is ignored: ranks must stay in lockstep; rank 0 stops between steps.
        r = self.recipe
        advantages = compute_advantages(batch.rewards, batch.group_index, r.loss.advantage_norm)
        weights = aggregation_weights(batch.loss_mask, batch.group_index, r.loss.aggregation)
        parts = micro_batches(batch, micro_batch_tokens or r.learner.micro_batch_tokens)
        mine = parts[self.rank::self.world]
        rounds = math.ceil(len(parts) / self.world)
        # on the trainer's device: the collective below runs on NCCL when that is CUDA (NCCL has no CPU tensors)
        new_logprobs = torch.zeros(batch.loss_mask.shape, dtype=torch.float64, device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        for i in range(rounds):
            rows = mine[i] if i < len(mine) else parts[0]
            scale = float(self.world) if i < len(mine) else 0.0  # a zero-weight pass keeps collectives aligned
            self.scorer.set_requires_gradient_sync(i == rounds - 1)
            micro = select_rows(batch, rows, self.device)
            new = self.scorer(micro)
            loss = weighted_policy_loss(new, micro.old_logprobs, micro.loss_mask, advantages[rows].to(self.device),
                                        weights[rows] * scale, r.loss)
            loss.backward()
            if i < len(mine):
                new_logprobs[rows.to(self.device)] = new.detach().to(torch.float64)
        dist.all_reduce(new_logprobs)  # each row was scored by exactly one rank
        new_logprobs = new_logprobs.cpu()
        out = policy_loss(new_logprobs, batch.old_logprobs, batch.loss_mask, advantages, batch.group_index, r.loss)
        return out, len(parts)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every rank must call it; rank 0 gets the full CPU tensors (others an empty dict)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded(path: Path, model: nn.Module, optimizer, scheduler=None) -> None:
    """A torch.distributed.checkpoint directory of the sharded model, optimizer and LR schedule (every rank
    writes its shards); it loads on any world size."""
    dcp.save(_state(model, optimizer, scheduler), checkpoint_id=str(path))


def load_sharded(path: Path, model: nn.Module, optimizer, scheduler=None) -> None:
    state = _state(model, optimizer, scheduler)
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])


def _state(model: nn.Module, optimizer, scheduler) -> dict:
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state
