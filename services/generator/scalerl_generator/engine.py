"""GenerationEngine: vLLM v1 in this process, driven by one engine thread, with in-flight weight updates,
per-token policy versions and forced interruption (docs/scalerl.md §3-4).

Why in-process: vLLM's AsyncLLM runs the engine core (and, on CPU, its worker) in separate processes that
exchange every step over IPC and busy-poll shared memory; on the 2-core demo box that cost the generator ~1.6
cores for 256 short completions per 0.2 s, against ~1 core per 0.09 s in-process. PipelineRL drives its engine
the same way: its own loop around ``step()``, weights swapped between two steps.

Facts this module relies on (vLLM 0.32, checked in the installed source and in tests/test_engine.py):

* One thread owns the ``LLMEngine`` (built with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: in-process engine core,
  uniprocess executor). Everything that touches it is a command run on that thread between two ``step()``
  calls; coroutines on the caller's event loop wait for results through futures.
* In-flight update = a command run between two steps, so nothing is mid-forward: ``collective_rpc`` into
  :class:`~scalerl_generator.worker_ext.WeightLoaderExtension`, then (``kv_cache="recompute"``)
  ``reset_prefix_cache(reset_running_requests=True)``, which preempts the running requests so their prompt +
  output is re-prefilled with the new weights, then ``set_weight_version(str(version))`` only after the load
  succeeded. Requests are frozen, not aborted, and continue mid-sequence. ``kv_cache="keep"`` keeps the KV
  the old weights computed for the *running* requests (PipelineRL's behaviour) but still empties the prefix
  cache (:func:`forget_prefix_cache`): a request submitted after the update, labelled with the new version,
  never reuses blocks computed by older weights (vLLM's own ``reset_prefix_cache`` refuses while blocks are in
  use, so with requests running the cached hashes are dropped from the block pool directly).
* vLLM labels every step's output with the engine's current weight version label; the final
  ``CompletionOutput.weight_versions`` holds ``[start, end)`` spans over output tokens. Labels are set to
  ``str(int)`` here, ``"0"`` before the first request.
* Log-probs: the engine is built with ``logprobs_mode="processed_logprobs"``, so the returned log-prob of a
  sampled token is log softmax(logits / T) after top-p masking, i.e. the probability it was actually sampled
  with (vLLM's default "raw_logprobs" ignores temperature).
* FP32 LM head: ``hf_overrides={"head_dtype": "float32"}`` makes vLLM's LogitsProcessor project the final
  hidden state with an fp32 copy of lm_head (a no-op for a float32 model).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from scalerl.weights.base import NamedTensors, ReceivedWeights
from scalerl_generator.interruption import END_OF_THINKING, draw_budget, merge_spans

log = logging.getLogger(__name__)

WORKER_EXTENSION = "scalerl_generator.worker_ext.WeightLoaderExtension"
GiB = 1 << 30


class WeightUpdateError(RuntimeError):
    """A weight update was rejected or failed; the engine still serves the previous weights and version."""


@dataclass
class SampledCompletion:
    token_ids: list[int]
    # Generator log-prob of each output token under the policy that sampled it (0.0 for injected tokens).
    logprobs: list[float]
    # (policy_version, start, end) spans over output tokens, covering all of them.
    versions: list[tuple[int, int, int]]
    # False for injected tokens (the interruption phrase).
    loss_mask: list[bool]
    finish_reason: str  # "stop" | "length" | "interrupted" | "aborted"
    text: str
    # Index of the first injected token when interrupted, else None.
    interrupted_at: int | None = field(default=None)


@dataclass
class _Part:
    token_ids: list[int]
    logprobs: list[float]
    versions: list[tuple[int, int, int]]
    finish_reason: str


def sampled_logprobs(token_ids: list[int], logprobs) -> list[float]:
    """The log-prob of each sampled token, from vLLM's per-position log-probs (flat lists or a dict per token)."""
    from vllm.logprobs import FlatLogprobs

    if not isinstance(logprobs, FlatLogprobs):
        return [lp[t].logprob for t, lp in zip(token_ids, logprobs)]
    ids, values = logprobs.token_ids, logprobs.logprobs
    out = []
    for t, start, end in zip(token_ids, logprobs.start_indices, logprobs.end_indices):
        i = start if ids[start] == t else ids.index(t, start, end)
        out.append(values[i])
    return out


def forget_prefix_cache(engine) -> None:
    """Make every cached KV block unreachable for new requests; running requests keep the blocks they hold.

    Runs on the engine thread between two steps. With nothing running this is vLLM's reset; otherwise vLLM's
    reset would refuse (blocks in use), so each block's prefix-cache hashes are removed from the block pool, as
    the pool does when it evicts a block. A block a running request still holds is then just that request's
    KV: it goes back to the free list uncached when the request ends."""
    scheduler = engine.engine_core.engine_core.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    if pool.get_num_free_blocks() == pool.num_gpu_blocks - 1:  # only the null block is in use
        if engine.reset_prefix_cache():
            return
    for block in pool.blocks:
        pool._remove_cached_block_hashes(block)


def _finish_reason(reason: str | None) -> str:
    if reason == "abort" or reason is None:
        return "aborted"
    return reason  # "stop" | "length"


def _for_workers(weights) -> "dict | str":
    """What the worker extension loads: named tensors, or a safetensors path it reads itself."""
    from scalerl_generator.worker_ext import WeightLoadError

    if isinstance(weights, (str, os.PathLike)):
        return os.fspath(weights)
    if isinstance(weights, ReceivedWeights):
        try:
            return weights.for_workers()
        except Exception as exc:  # a blob that does not decode (safetensors raises its own error types)
            raise WeightLoadError(f"could not decode the received weights: {exc}") from exc
    if isinstance(weights, Mapping):
        return dict(weights)
    if isinstance(weights, (bytes, bytearray, memoryview)) or not isinstance(weights, Iterable):
        raise WeightLoadError(f"weights must be named tensors, received weights or a safetensors path, "
                              f"got {type(weights).__name__}")
    try:
        return dict(weights)
    except (TypeError, ValueError) as exc:
        raise WeightLoadError(f"weights are not (name, tensor) pairs: {exc}") from exc


class EngineDeadError(RuntimeError):
    """The engine thread stopped (crashed or shut down); the engine must be rebuilt."""


EngineState = Literal["loading", "ready", "stopped", "failed"]
_state_listeners: list[Callable[[EngineState], None]] = []


def on_engine_state(listener: Callable[[EngineState], None]) -> Callable[[], None]:
    """Call ``listener(state)`` whenever an engine of this process starts loading, is ready, stops or fails
    (the generator's readiness follows it), from the caller's loop or the engine thread. Returns the unsubscribe."""
    _state_listeners.append(listener)
    return lambda: _state_listeners.remove(listener)


def _announce(state: EngineState) -> None:
    for listener in list(_state_listeners):
        try:
            listener(state)
        except Exception:  # noqa: BLE001 - an observer never breaks the engine
            log.exception("engine state listener failed")


_STOP = object()


class GenerationEngine:
    def __init__(self, model_path: str, *, seed: int = 0, max_model_len: int = 128, fp32_lm_head: bool = True,
                 dtype: str = "float32", kv_cache_gib: float = 1.0, enforce_eager: bool = True,
                 enable_prefix_caching: bool = True, max_num_seqs: int | None = None,
                 block_size: int | None = None, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.9):
        """``kv_cache_gib`` 0: vLLM sizes the KV cache from ``gpu_memory_utilization``. The machine-dependent
        arguments are scalerl.settings.EngineSettings' fields (``**settings.engine.model_dump()``)."""
        self.model_path = str(model_path)
        self.seed = seed
        self.max_model_len = max_model_len
        self.fp32_lm_head = fp32_lm_head
        self.dtype = dtype
        self.kv_cache_gib = kv_cache_gib
        self.enforce_eager = enforce_eager
        self.tensor_parallel_size = tensor_parallel_size
        self.gpu_memory_utilization = gpu_memory_utilization
        self.enable_prefix_caching = enable_prefix_caching
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size  # KV block (prefix-cache) granularity; None: vLLM's platform default
        self._llm = None  # the LLMEngine; touched only on the engine thread
        self._tokenizer = None
        self._phrase_cache: dict[str, list[int]] = {}
        self._version = 0
        self._update_lock = asyncio.Lock()
        self._reference_specs = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead: BaseException | None = None
        self.last_load_seconds: float | None = None  # worker-side load time of the last successful update

    # ------------------------------------------------------------------ lifecycle
    def engine_args(self):
        """The EngineArgs this engine starts vLLM with."""
        from vllm.engine.arg_utils import EngineArgs

        kwargs = {}
        if self.max_num_seqs is not None:
            kwargs["max_num_seqs"] = self.max_num_seqs
        if self.block_size is not None:
            kwargs["block_size"] = self.block_size
        if self.fp32_lm_head:
            kwargs["hf_overrides"] = {"head_dtype": "float32"}
        if self.kv_cache_gib > 0:  # else vLLM profiles memory and keeps what gpu_memory_utilization leaves
            kwargs["kv_cache_memory_bytes"] = int(self.kv_cache_gib * GiB)
        return EngineArgs(
            model=self.model_path, seed=self.seed, max_model_len=self.max_model_len, dtype=self.dtype,
            enforce_eager=self.enforce_eager, tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization, worker_extension_cls=WORKER_EXTENSION, logprobs_mode="processed_logprobs",
            enable_prefix_caching=self.enable_prefix_caching, disable_log_stats=True, **kwargs,
        )

    async def start(self) -> None:
        from transformers import AutoTokenizer

        from scalerl_generator.worker_ext import _read_reference_specs

        _announce("loading")
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            self._reference_specs = _read_reference_specs(self.model_path)
            self._loop = asyncio.get_running_loop()
            ready: asyncio.Future = self._loop.create_future()
            self._thread = threading.Thread(target=self._serve, args=(ready,), name="vllm-engine", daemon=True)
            self._thread.start()
            await ready
        except BaseException:
            _announce("failed")
            raise
        _announce("ready")

    def _build(self):
        from vllm.v1.engine.llm_engine import LLMEngine

        # In-process engine core and executor (the CPU platform otherwise forces a worker process).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        engine = LLMEngine.from_engine_args(self.engine_args(), enable_multiprocessing=False)
        # Labels are only labels: set one before the first request so every token carries a version.
        engine.set_weight_version(str(self._version))
        return engine

    def _serve(self, ready: asyncio.Future) -> None:
        """The engine thread: run queued commands, step while requests are unfinished, block when idle."""
        loop = self._loop
        try:
            self._llm = self._build()
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            self._dead = exc
            loop.call_soon_threadsafe(lambda: ready.done() or ready.set_exception(exc))
            return
        loop.call_soon_threadsafe(lambda: ready.done() or ready.set_result(None))
        engine = self._llm
        try:
            while True:
                try:
                    command = self._commands.get(block=not engine.has_unfinished_requests())
                except queue.Empty:
                    command = None
                if command is _STOP:
                    break
                if command is not None:
                    command(engine)
                    continue  # run every queued command before the next step
                for out in engine.step():
                    stream = self._streams.get(out.request_id)
                    if stream is not None:
                        loop.call_soon_threadsafe(stream.put_nowait, out)
        except BaseException as exc:  # noqa: BLE001 - a dead engine fails every waiter, never hangs them
            log.exception("vLLM engine thread failed")
            self._dead = exc
            _announce("failed")
        else:
            _announce("stopped")
        finally:
            self._dead = self._dead or EngineDeadError("engine shut down")
            failure = EngineDeadError(f"engine stopped while generating: {self._dead!r}")
            for stream in list(self._streams.values()):
                loop.call_soon_threadsafe(stream.put_nowait, failure)
            while True:  # commands queued behind the failure or the stop
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if command is not _STOP:
                    command(None)
            try:
                engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001
                log.debug("engine core shutdown failed", exc_info=True)

    def _post(self, fn: Callable[[Any], Any], deliver: Callable[[Any, Exception | None], None]) -> None:
        """Queue ``fn(engine)`` for the engine thread; ``deliver(result, error)`` then runs on the caller's loop."""
        loop = asyncio.get_running_loop()

        def command(engine) -> None:
            if engine is None:  # queued behind a stop or a crash
                loop.call_soon_threadsafe(deliver, None, EngineDeadError("engine shut down"))
                return
            try:
                result = fn(engine)
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                loop.call_soon_threadsafe(deliver, None, exc)
            else:
                loop.call_soon_threadsafe(deliver, result, None)

        self._commands.put(command)

    async def _call(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(engine)`` on the engine thread between two steps and return its result."""
        if self._dead is not None:
            raise EngineDeadError(f"engine not running: {self._dead!r}")
        future: asyncio.Future = asyncio.get_running_loop().create_future()

        def settle(result, error) -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(result)

        self._post(fn, settle)
        return await future

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._dead is None

    async def shutdown(self) -> None:
        if self._thread is not None:
            self._commands.put(_STOP)
            await asyncio.to_thread(self._thread.join, 60)
            self._thread = None
        self._llm = None

    @property
    def current_version(self) -> int:
        return self._version

    @property
    def tokenizer(self):
        return self._tokenizer

    async def collective_rpc(self, method: str, args: tuple = ()) -> list:
        """A worker-extension call on the engine thread (diagnostics, tests)."""
        return await self._call(lambda engine: engine.collective_rpc(method, args=args))

    async def weight_version_label(self) -> str:
        """The version label vLLM attaches to tokens generated now."""
        return await self._call(lambda engine: engine.get_weight_version())

    # ------------------------------------------------------------------ weights
    async def update_weights(self, weights: NamedTensors | ReceivedWeights | str, version: int,
                             kv_cache: Literal["keep", "recompute"] = "keep") -> float:
        """Load new weights while requests are in flight; returns the seconds generation was paused.

        ``weights``: the full state dict in HF checkpoint names, as named tensors (a dict or (name, tensor)
        pairs), as what a weight transport handed over (:class:`~scalerl.weights.ReceivedWeights`: decoded
        here, off the event loop and before pausing), or as the path of a .safetensors file the worker reads
        itself. Names, shapes and dtypes are checked here before pausing; the worker then checks values and
        loads in place. On any failure this raises WeightUpdateError, the version label stays unchanged, and
        generation resumes on the old weights.
        """
        if kv_cache not in ("keep", "recompute"):
            raise ValueError(f"kv_cache must be 'keep' or 'recompute', got {kv_cache!r}")
        if self._llm is None:
            raise RuntimeError("engine not started")
        from scalerl_generator.worker_ext import WeightLoadError, check_specs

        try:
            source = await asyncio.to_thread(_for_workers, weights)
            if not isinstance(source, str):
                check_specs(source, self._reference_specs)
        except WeightLoadError as exc:
            raise WeightUpdateError(f"weights for version {version} rejected: {exc}") from exc

        def swap(engine) -> tuple[float, float]:
            # Runs between two steps: generation is paused for exactly this long.
            start = time.perf_counter()
            try:
                results = engine.collective_rpc("scalerl_load_weights", args=(source,))
            except Exception as exc:
                raise WeightUpdateError(f"loading weights for version {version} failed: {exc}") from exc
            if kv_cache == "recompute":
                engine.reset_prefix_cache(reset_running_requests=True)
            elif self.enable_prefix_caching:
                forget_prefix_cache(engine)
            engine.set_weight_version(str(version))
            return time.perf_counter() - start, max(r["seconds"] for r in results)

        async with self._update_lock:
            pause, self.last_load_seconds = await self._call(swap)
            self._version = version
            return pause

    # ------------------------------------------------------------------ generation
    async def _run(self, prompt_token_ids: list[int], params, request_id: str,
                   on_tokens: Callable[[int], None] | None = None) -> _Part:
        return (await self._run_parts(prompt_token_ids, params, request_id, on_tokens))[0]

    async def _run_parts(self, prompt_token_ids: list[int], params, request_id: str,
                         on_tokens: Callable[[int], None] | None = None) -> list[_Part]:
        """One vLLM request -> a part per sampled sequence (params.n of them, in index order). A request of
        n > 1 must ask for FINAL_ONLY output: its n sequences then arrive together, once all have ended."""
        from vllm.inputs import tokens_input

        if self._dead is not None:
            raise EngineDeadError(f"engine not running: {self._dead!r}")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        token_ids: list[int] = []
        logprobs: list[float] = []
        final = None

        def on_added(_, error) -> None:
            if error is not None:
                stream.put_nowait(error)

        try:
            # Fire and forget (no round trip per request), so a burst of requests lands before the next step. The
            # prompt goes in as rendered engine input: token ids need no rendering (vLLM's path for raw prompts
            # costs a render and a deprecation-warning lookup per request).
            self._post(lambda engine: engine.add_request(request_id, tokens_input(prompt_token_ids), params), on_added)
            while final is None:
                out = await stream.get()
                if isinstance(out, Exception):  # add_request failed, or the engine stopped
                    raise out
                if out.finished and len(out.outputs) > 1:
                    final = out.outputs
                    break
                c = out.outputs[0]
                new = list(c.token_ids)
                token_ids.extend(new)
                if c.logprobs is not None:
                    logprobs.extend(sampled_logprobs(new, c.logprobs))
                if new and on_tokens is not None:
                    on_tokens(len(token_ids))
                if out.finished:
                    final = [c]
        except asyncio.CancelledError:
            if self._dead is None:
                self._commands.put(lambda engine: engine is not None and engine.abort_request([request_id]))
            raise
        finally:
            self._streams.pop(request_id, None)
        if len(final) == 1:  # tokens (and log-probs) may have streamed in deltas
            return [self._part(final[0], token_ids, logprobs)]
        return [self._part(c, list(c.token_ids), sampled_logprobs(list(c.token_ids), c.logprobs))
                for c in sorted(final, key=lambda c: c.index)]

    def _part(self, final, token_ids: list[int], logprobs: list[float]) -> _Part:
        spans = final.weight_versions or []
        versions = [(int(s.version), s.start, s.end) for s in spans]
        if not versions and token_ids:
            versions = [(self._version, 0, len(token_ids))]
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"got {len(logprobs)} log-probs for {len(token_ids)} tokens")
        return _Part(token_ids, logprobs, versions, _finish_reason(final.finish_reason))

    def _text(self, token_ids: list[int], finish_reason: str) -> str:
        """The text as vLLM's detokenizer would give it (requests skip that per-token work): a stop token's text
        is left out, special tokens are skipped. A completion of two requests is decoded whole: SentencePiece
        tokenizers drop a piece's leading space when it is decoded on its own."""
        shown = token_ids[:-1] if finish_reason == "stop" else token_ids
        return self._tokenizer.decode(shown, skip_special_tokens=True)

    def _phrase_ids(self, phrase: str) -> list[int]:
        ids = self._phrase_cache.get(phrase)
        if ids is None:
            ids = self._phrase_cache[phrase] = self._tokenizer(phrase, add_special_tokens=False)["input_ids"]
        return ids

    async def generate(self, prompt_token_ids: list[int], n: int, *, temperature: float = 1.0, top_p: float = 1.0,
                       max_tokens: int, thinking_budget: tuple[int, int] | None = None, solution_budget: int = 0,
                       interruption_phrase: str = "", stop_token_ids: list[int] | None = None,
                       request_id: str | None = None, ignore_eos: bool = False, sample_seed: int | None = None,
                       on_tokens: Callable[[int, int], None] | None = None) -> list[SampledCompletion]:
        """Sample ``n`` independent completions of one prompt. Completions with the same token cap go as one vLLM
        request of that many sequences, the rest as a request each; all share the prefix cache.

        Forced interruption, when ``thinking_budget=(low, high)`` and ``interruption_phrase`` are given: each
        completion draws a budget B uniformly from [low, high] (seeded by engine seed, request id and index).
        Phase 1 samples up to min(B, max_tokens) tokens. If it stopped (EOS / stop token) it is returned as
        is. If it reached B without having emitted "</think>", the phrase tokens (tokenizer, no BOS) are
        appended with loss_mask False and log-prob 0.0, and a continuation request (prompt + output +
        phrase, prefix-cached) samples up to ``solution_budget`` more tokens; finish_reason "interrupted".
        If "</think>" was already emitted, the completion continues without the phrase up to max_tokens in
        total. Every request is capped so that prompt + output fits in max_model_len.

        ``sample_seed``: per-request sampling seeds (seed + index) for reproducible samples; None uses the
        engine's RNG. ``on_tokens(index, tokens_so_far)`` is called as tokens stream in.
        """
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        if self._llm is None:
            raise RuntimeError("engine not started")
        if n < 1 or max_tokens < 1:
            raise ValueError("n and max_tokens must be >= 1")
        rid = request_id or uuid.uuid4().hex
        prompt = list(prompt_token_ids)
        use_interruption = thinking_budget is not None and bool(interruption_phrase)
        phrase_ids = self._phrase_ids(interruption_phrase) if use_interruption else []

        # Streaming deltas only when someone listens; otherwise one output per request, so one hop from the
        # engine thread to the event loop instead of one per step.
        output_kind = RequestOutputKind.DELTA if on_tokens is not None else RequestOutputKind.FINAL_ONLY

        def params(max_new: int, index: int, part: int, n: int = 1) -> SamplingParams:
            # Per-request CPU is the generator's bottleneck on small models (docs/benchmarks/generator.md): these
            # params are never shared (a shallow clone will do), the text is decoded once at the end instead of
            # per token, and log-probs come in flat lists instead of a dict per token.
            return SamplingParams(
                n=n, temperature=temperature, top_p=top_p, max_tokens=max_new, logprobs=0,
                stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, output_kind=output_kind,
                seed=None if sample_seed is None else sample_seed + 1000003 * part + index,
                skip_clone=True, detokenize=False, flat_logprobs=True,
            )

        def room(context_len: int) -> int:
            return self.max_model_len - context_len

        budgets = [draw_budget(thinking_budget, seed=self.seed, request_id=rid, index=i) if use_interruption
                   else None for i in range(n)]
        caps = [min(max_tokens, room(len(prompt)), max_tokens if b is None else b) for b in budgets]

        async def one(i: int) -> SampledCompletion:
            cb = (lambda k: on_tokens(i, k)) if on_tokens is not None else None
            return await finish(i, await self._run(prompt, params(caps[i], i, 0), f"{rid}-{i}", cb), cb)

        async def together(indices: list[int]) -> list[SampledCompletion]:
            if len(indices) == 1:
                return [await one(indices[0])]
            # One request samples them all: vLLM processes its input once and fans out n sequences, which costs
            # less CPU than n requests (the generator's bottleneck on small models, docs/benchmarks/generator.md).
            # Only completions with the same token cap can share one: max_tokens is the request's.
            parts = await self._run_parts(prompt, params(caps[indices[0]], indices[0], 0, n=len(indices)),
                                          f"{rid}-{indices[0]}")
            return list(await asyncio.gather(*(finish(i, part, None) for i, part in zip(indices, parts))))

        async def finish(i: int, first: _Part, cb) -> SampledCompletion:
            """The completion whose first request sampled `first`: as it is, or continued past its budget."""
            budget = budgets[i]
            first_text = self._text(first.token_ids, first.finish_reason)
            done = SampledCompletion(first.token_ids, first.logprobs, first.versions,
                                     [True] * len(first.token_ids), first.finish_reason, first_text)
            if (budget is None or first.finish_reason != "length" or len(first.token_ids) < budget):
                return done
            # Reached the thinking budget.
            context = prompt + first.token_ids
            offset = len(first.token_ids)
            if END_OF_THINKING in first_text:  # thinking already over: just let it continue
                extra = min(max_tokens - offset, room(len(context)))
                if extra <= 0:
                    return done
                base = lambda k: cb(offset + k) if cb else None  # noqa: E731
                rest = await self._run(context, params(extra, i, 1), f"{rid}-{i}-c", base if cb else None)
                token_ids = first.token_ids + rest.token_ids
                return SampledCompletion(
                    token_ids, first.logprobs + rest.logprobs,
                    merge_spans(first.versions + [(v, s + offset, e + offset) for v, s, e in rest.versions]),
                    [True] * len(token_ids), rest.finish_reason, self._text(token_ids, rest.finish_reason))
            if room(len(context) + len(phrase_ids)) < 0:
                return done  # no room for the phrase: a plain "length" completion
            context = context + phrase_ids
            sol = min(solution_budget, room(len(context)))
            k0 = offset + len(phrase_ids)
            if sol > 0:
                base = lambda k: cb(k0 + k) if cb else None  # noqa: E731
                rest = await self._run(context, params(sol, i, 1), f"{rid}-{i}-c", base if cb else None)
            else:
                rest = _Part([], [], [], "length")
            if rest.finish_reason == "aborted":
                reason = "aborted"
            else:
                reason = "interrupted"
            # The phrase tokens were sampled by no policy; they are labelled with the version whose weights
            # computed their KV (the continuation's first version).
            phrase_version = rest.versions[0][0] if rest.versions else self._version
            versions = merge_spans(first.versions + [(phrase_version, offset, k0)]
                                   + [(v, s + k0, e + k0) for v, s, e in rest.versions])
            token_ids = first.token_ids + phrase_ids + rest.token_ids
            return SampledCompletion(
                token_ids, first.logprobs + [0.0] * len(phrase_ids) + rest.logprobs, versions,
                [True] * offset + [False] * len(phrase_ids) + [True] * len(rest.token_ids),
                reason, self._text(token_ids, rest.finish_reason), interrupted_at=offset)

        if on_tokens is not None or sample_seed is not None:  # per-completion streams or seeds: a request each
            return list(await asyncio.gather(*(one(i) for i in range(n))))
        by_cap: dict[int, list[int]] = {}
        for i, cap in enumerate(caps):
            by_cap.setdefault(cap, []).append(i)
        done = await asyncio.gather(*(together(indices) for indices in by_cap.values()))
        out: list[SampledCompletion | None] = [None] * n
        for indices, completions in zip(by_cap.values(), done):
            for i, completion in zip(indices, completions):
                out[i] = completion
        return out
