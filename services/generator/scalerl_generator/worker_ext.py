"""vLLM worker extension: in-place weight loading from a safetensors blob (or file path).

vLLM mixes this class into its Worker (``AsyncEngineArgs(worker_extension_cls=...)``), so the methods run in
the worker process and are reached with ``AsyncLLM.collective_rpc("scalerl_load_weights", args=(blob,))``.
Method names carry a ``scalerl_`` prefix because vLLM refuses extension attributes that clash with the
Worker's own (it already has ``update_weights``).

Why bytes or a path: tensors passed through ``collective_rpc`` arrive as nested lists, so the learner's
state dict travels as one safetensors blob.

Why ``model_runner.reload_weights``: on CPU, vLLM repacks linear weights for oneDNN after loading, so
``model.load_weights`` on the live model fails half-way; ``reload_weights`` (vLLM's layer-wise in-place
reload) re-materialises each layer in checkpoint format, runs the post-load processing and copies the result
into the existing storage.

Atomicity: vLLM's reload leaves a layer half-built if a weight loader raises mid-way, so every blob is
validated *before* the model is touched: it must parse, contain exactly the checkpoint's tensor names (the
names and shapes of the model's own safetensors files, read once at first use), with the same shapes and
only finite floating-point values. If the reload still fails after validation, the last good weights are
reloaded (the worker keeps a reference to the last good blob, or the original checkpoint) before the error
is re-raised.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Iterator

import torch

log = logging.getLogger(__name__)


class WeightLoadError(ValueError):
    """The blob was rejected before the model was touched."""


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


_ST_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def check_header(blob: bytes, reference: dict[str, tuple[int, ...]] | None) -> None:
    """Cheap pre-check of a safetensors blob (header only: framing, names, shapes, dtypes, offsets).

    The engine runs it before pausing generation, so an obviously bad blob costs no pause at all.
    """
    import json
    import struct

    if not isinstance(blob, (bytes, bytearray, memoryview)) or len(blob) < 8:
        raise WeightLoadError("not a safetensors blob (too short)")
    (n,) = struct.unpack("<Q", bytes(blob[:8]))
    if n > len(blob) - 8:
        raise WeightLoadError("not a safetensors blob (header length exceeds blob)")
    try:
        header = json.loads(bytes(blob[8:8 + n]))
    except ValueError as exc:
        raise WeightLoadError(f"not a safetensors blob (bad header: {exc})") from exc
    if not isinstance(header, dict):
        raise WeightLoadError("not a safetensors blob (header is not an object)")
    header.pop("__metadata__", None)
    data_len = len(blob) - 8 - n
    specs = {}
    for name, info in header.items():
        try:
            dtype, shape, (lo, hi) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise WeightLoadError(f"bad header entry for {name}") from exc
        if dtype not in _ST_DTYPES:
            raise WeightLoadError(f"tensor {name} has non-floating dtype {dtype}")
        if not 0 <= lo <= hi <= data_len:
            raise WeightLoadError(f"tensor {name} data offsets {lo}..{hi} outside the blob")
        specs[name] = shape
    if not specs:
        raise WeightLoadError("weights blob holds no tensors")
    if reference is not None:
        _compare(specs, reference)


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


def parse_and_validate(source: bytes | str, reference: dict[str, tuple[int, ...]] | None
                       ) -> dict[str, torch.Tensor]:
    """Parse a safetensors blob (bytes) or file path and check it against the reference specs."""
    from safetensors.torch import load, load_file

    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            tensors = load(bytes(source))
        elif isinstance(source, str):
            tensors = load_file(source)
        else:
            raise WeightLoadError(f"weights must be safetensors bytes or a path, got {type(source).__name__}")
    except WeightLoadError:
        raise
    except Exception as exc:  # safetensors raises its own error types for corrupt data
        raise WeightLoadError(f"could not parse safetensors weights: {exc}") from exc
    if not tensors:
        raise WeightLoadError("weights blob holds no tensors")
    if reference is not None:
        _compare({n: tuple(t.shape) for n, t in tensors.items()}, reference)
    for name, t in tensors.items():
        if not t.is_floating_point():
            raise WeightLoadError(f"tensor {name} has non-floating dtype {t.dtype}")
        if not torch.isfinite(t).all():
            raise WeightLoadError(f"tensor {name} holds non-finite values")
    return tensors


class WeightLoaderExtension:
    """Mixed into vLLM's Worker; ``self.model_runner`` and ``self.vllm_config`` come from the Worker."""

    _scalerl_reference: dict[str, tuple[int, ...]] | None
    _scalerl_last_good: bytes | str | None

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
            return
        items: Iterator[tuple[str, torch.Tensor]] = iter(tensors.items())
        runner.reload_weights(weights_iterator=items)

    def scalerl_load_weights(self, source: bytes | str) -> dict:
        """Validate, then load in place. Returns {"seconds", "num_tensors"}."""
        self._scalerl_state()
        start = time.perf_counter()
        tensors = parse_and_validate(source, self._scalerl_reference)
        try:
            with torch.no_grad():
                self._scalerl_reload(tensors)
        except Exception:
            log.exception("weight reload failed after validation; restoring the last good weights")
            try:
                last = self._scalerl_last_good
                with torch.no_grad():
                    self._scalerl_reload(None if last is None else parse_and_validate(last, None))
            except Exception:
                log.exception("restoring the last good weights failed too: the model is in an undefined state")
            raise
        # Kept for the rollback above: one blob's worth of host memory.
        self._scalerl_last_good = source if isinstance(source, (str, bytes)) else bytes(source)
        return {"seconds": time.perf_counter() - start, "num_tensors": len(tensors)}

    def scalerl_weights_checksum(self) -> float:
        """Sum of all parameters in float64: a cheap check (tests) that weights did or did not change."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with torch.no_grad():
            return float(sum(p.detach().double().sum().item() for p in model.parameters()))
