"""vLLM worker extension: in-place weight loading from named tensors (or a safetensors file path).

vLLM mixes this class into its Worker (``EngineArgs(worker_extension_cls=...)``), so the methods run in the
worker and are reached with ``collective_rpc("scalerl_load_weights", args=(tensors,))``.
Method names carry a ``scalerl_`` prefix because vLLM refuses extension attributes that clash with the
Worker's own (it already has ``update_weights``).

Named tensors or a path: the generator runs vLLM's in-process uniprocess executor, so ``collective_rpc`` hands
the worker the very dict the weight transport produced (no copy, no serialisation). A multi-process executor
would serialise its arguments: there a transport hands over a path the workers read themselves (the filesystem
transport), or receives the tensors inside the workers (a collective transport).

Why ``model_runner.reload_weights``: on CPU, vLLM repacks linear weights for oneDNN after loading, so
``model.load_weights`` on the live model fails half-way; ``reload_weights`` (vLLM's layer-wise in-place
reload) re-materialises each layer in checkpoint format, runs the post-load processing and copies the result
into the existing storage.

Atomicity: vLLM's reload leaves a layer half-built if a weight loader raises mid-way, so every update is
validated *before* the model is touched: it must hold exactly the checkpoint's tensor names (the names and
shapes of the model's own safetensors files, read once at first use), with the same shapes and only finite
floating-point values. If the reload still fails after validation, the last good weights are reloaded (the
worker keeps a reference to the last good tensors, or the original checkpoint) before the error is re-raised.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Iterator, Mapping

import torch

log = logging.getLogger(__name__)


class WeightLoadError(ValueError):
    """The weights were rejected before the model was touched."""


def _read_reference_specs(model_dir: str) -> dict[str, tuple[int, ...]] | None:
    """Tensor names and shapes of the checkpoint the engine started from (headers only)."""
    from safetensors import safe_open

    if not os.path.isdir(model_dir):
        return None
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        return None
    specs: dict[str, tuple[int, ...]] = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                specs[name] = tuple(f.get_slice(name).get_shape())
    return specs


def check_specs(tensors: Mapping[str, torch.Tensor], reference: dict[str, tuple[int, ...]] | None) -> None:
    """Cheap pre-check of named tensors (metadata only: names, shapes, floating dtypes; no pass over values).

    The engine runs it before pausing generation, so obviously wrong weights cost no pause at all.
    """
    if not isinstance(tensors, Mapping):
        raise WeightLoadError(f"weights must be named tensors or a safetensors path, got {type(tensors).__name__}")
    if not tensors:
        raise WeightLoadError("weights hold no tensors")
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise WeightLoadError(f"{name} is a {type(t).__name__}, not a tensor")
        if not t.is_floating_point():
            raise WeightLoadError(f"tensor {name} has non-floating dtype {t.dtype}")
    if reference is not None:
        _compare({n: tuple(t.shape) for n, t in tensors.items()}, reference)


def _compare(specs: dict[str, tuple[int, ...]], reference: dict[str, tuple[int, ...]]) -> None:
    unknown = sorted(set(specs) - set(reference))
    missing = sorted(set(reference) - set(specs))
    if unknown or missing:
        raise WeightLoadError(f"tensor names differ from the checkpoint: unknown {unknown[:5]}"
                              f"{'...' if len(unknown) > 5 else ''}, missing {missing[:5]}"
                              f"{'...' if len(missing) > 5 else ''}")
    bad = [(n, s, reference[n]) for n, s in specs.items() if s != reference[n]]
    if bad:
        raise WeightLoadError(f"tensor shapes differ from the checkpoint (name, got, expected): {bad[:5]}")


def validate(source: Mapping[str, torch.Tensor] | str, reference: dict[str, tuple[int, ...]] | None
             ) -> dict[str, torch.Tensor]:
    """Named tensors (or a safetensors file the worker reads itself), checked against the reference specs and
    for finite values."""
    if isinstance(source, str):
        from safetensors.torch import load_file

        try:
            source = load_file(source)
        except Exception as exc:  # safetensors raises its own error types for missing or corrupt files
            raise WeightLoadError(f"could not read safetensors weights: {exc}") from exc
    check_specs(source, reference)
    for name, t in source.items():
        if not torch.isfinite(t).all():
            raise WeightLoadError(f"tensor {name} holds non-finite values")
    return dict(source)


def refresh_tied_layers(model: torch.nn.Module) -> list[str]:
    """Re-run the post-load processing of every layer whose weight is another layer's (a tied lm_head).

    vLLM's layer-wise reload processes a layer when its own checkpoint tensors arrive; a tied lm_head has none
    (the checkpoint holds the embedding only), so it is put back unprocessed. Its parameter is the embedding's
    and holds the new values, but on CPU the matmul runs on the oneDNN / packed copy made when the layer was
    first processed: without this, a tied model (SmolLM2, Qwen2.5-0.5B, Llama-3.2-1B) samples every update with
    the starting lm_head (log-probs off by 0.93 nats after one update of a tied tiny model). Returns the names
    refreshed. The first module holding a weight is taken as its owner: vLLM's models build the embedding before
    the head, and the owner got its own tensors in the reload."""
    owners: dict[int, str] = {}
    refreshed = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor):
            continue
        if id(weight) not in owners:
            owners[id(weight)] = name
            continue
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
            refreshed.append(name)
    return refreshed


class WeightLoaderExtension:
    """Mixed into vLLM's Worker; ``self.model_runner`` and ``self.vllm_config`` come from the Worker."""

    _scalerl_reference: dict[str, tuple[int, ...]] | None
    _scalerl_last_good: dict[str, torch.Tensor] | str | None

    def _scalerl_state(self) -> None:
        if not hasattr(self, "_scalerl_reference"):
            model_dir = self.vllm_config.model_config.model  # type: ignore[attr-defined]
            self._scalerl_reference = _read_reference_specs(model_dir)
            self._scalerl_last_good = None  # None: the original checkpoint on disk
            if self._scalerl_reference is None:
                log.warning("no local safetensors checkpoint at %s: weight names/shapes are not validated",
                            model_dir)

    def _scalerl_reload(self, tensors: dict[str, torch.Tensor] | None) -> None:
        runner = self.model_runner  # type: ignore[attr-defined]
        if tensors is None:
            runner.reload_weights()  # from the original checkpoint
        else:
            items: Iterator[tuple[str, torch.Tensor]] = iter(tensors.items())
            runner.reload_weights(weights_iterator=items)
        refresh_tied_layers(runner.get_model())

    def scalerl_load_weights(self, source: Mapping[str, torch.Tensor] | str) -> dict:
        """Validate, then load in place. Returns {"seconds", "num_tensors"}."""
        self._scalerl_state()
        start = time.perf_counter()
        tensors = validate(source, self._scalerl_reference)
        try:
            with torch.no_grad():
                self._scalerl_reload(tensors)
        except Exception:
            log.exception("weight reload failed after validation; restoring the last good weights")
            try:
                last = self._scalerl_last_good
                with torch.no_grad():
                    self._scalerl_reload(None if last is None else validate(last, None))
            except Exception:
                log.exception("restoring the last good weights failed too: the model is in an undefined state")
            raise
        # Kept for the rollback above: one state dict's worth of host memory (or just the path).
        self._scalerl_last_good = source if isinstance(source, str) else tensors
        return {"seconds": time.perf_counter() - start, "num_tensors": len(tensors)}

    def scalerl_weights_checksum(self) -> float:
        """Sum of all parameters in float64: a cheap check (tests) that weights did or did not change."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with torch.no_grad():
            return float(sum(p.detach().double().sum().item() for p in model.parameters()))
