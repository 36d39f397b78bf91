"""GenerationEngine against the tiny model on vLLM (CPU): log-probs vs HF, in-flight updates, failures,
forced interruption."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from scalerl_generator.engine import GenerationEngine, SampledCompletion, WeightUpdateError, _Part
from scalerl_generator.interruption import DEFAULT_INTERRUPTION_PHRASE, draw_budget, merge_spans

TOL = 1e-3  # float32 generator vs float32 HF forward
PROMPT = "12+7="


# ---------------------------------------------------------------------- HF references
def _processed_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """log-probs of vLLM's sampling distribution: logits / T, then vLLM's top-p mask, then log-softmax."""
    logits = logits.double() / temperature
    if top_p < 1.0:
        sorted_logits, idx = logits.sort(dim=-1, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        mask = cum <= 1 - top_p
        mask[..., -1] = False
        sorted_logits = sorted_logits.masked_fill(mask, -math.inf)
        logits = torch.empty_like(sorted_logits).scatter_(-1, idx, sorted_logits)
    return logits.log_softmax(-1)


@torch.no_grad()
def hf_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0, top_p: float = 1.0):
    """Log-prob of each output token from one forward pass over prompt + output."""
    ids = torch.tensor([prompt + output])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    lp = _processed_logprobs(logits, temperature, top_p)
    return lp.gather(-1, torch.tensor(output)[:, None])[:, 0].tolist()


@torch.no_grad()
def hf_keep_logprobs(old, new, prompt: list[int], output: list[int], switch: int, temperature: float = 1.0):
    """The "keep" reference: old weights compute the KV of prompt + output[:switch-1] (and sample
    output[:switch]); the new weights continue from that cache, processing output[switch-1:]."""
    prefix = prompt + output[:switch - 1]
    out_old = old(input_ids=torch.tensor([prefix]), use_cache=True)
    lp_old = _processed_logprobs(out_old.logits[0, len(prompt) - 1:], temperature, 1.0)
    out_new = new(input_ids=torch.tensor([output[switch - 1:-1]]), past_key_values=out_old.past_key_values,
                  use_cache=True)
    lp_new = _processed_logprobs(out_new.logits[0], temperature, 1.0)
    lp = torch.cat([lp_old, lp_new])
    return lp.gather(-1, torch.tensor(output)[:, None])[:, 0].tolist()


def max_gap(a, b) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


@pytest.fixture(scope="module")
def prompt_ids(engine):
    return engine.tokenizer(PROMPT)["input_ids"]


def _wait_all(n: int, at_least: int):
    """An on_tokens callback + event that fires once all n completions have >= at_least tokens."""
    progress: dict[int, int] = {}
    event = asyncio.Event()

    def cb(i: int, k: int) -> None:
        progress[i] = k
        if len(progress) == n and min(progress.values()) >= at_least:
            event.set()

    return cb, event


def _inflight(engine, loop, prompt_ids, weights, version, kv_cache, n=4, max_tokens=100, seed=11):
    async def go():
        cb, started = _wait_all(n, 5)
        task = asyncio.ensure_future(engine.generate(prompt_ids, n, max_tokens=max_tokens, ignore_eos=True,
                                                     sample_seed=seed, on_tokens=cb))
        await asyncio.wait_for(started.wait(), 60)
        err = None
        try:
            pause = await engine.update_weights(weights, version, kv_cache=kv_cache)
        except WeightUpdateError as exc:
            pause, err = None, exc
        return await task, pause, err

    return loop.run(go())


def _switch(c: SampledCompletion, old: int, new: int) -> int:
    assert [v for v, _, _ in c.versions] == [old, new], c.versions
    (_, s0, e0), (_, s1, e1) = c.versions
    assert s0 == 0 and e0 == s1 and e1 == len(c.token_ids)
    assert 0 < s1 < len(c.token_ids), "the update did not land mid-sequence"
    return s1


def _checksum(engine, loop) -> float:
    return loop.run(engine.collective_rpc("scalerl_weights_checksum"))[0]


# ---------------------------------------------------------------------- log-probs vs HF
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (0.7, 0.9)])
def test_logprobs_match_hf_forward(engine, loop, prompt_ids, hf_models, temperature, top_p):
    res = loop.run(engine.generate(prompt_ids, 4, max_tokens=40, temperature=temperature, top_p=top_p,
                                   ignore_eos=True, sample_seed=3))
    v = engine.current_version
    gaps = []
    for c in res:
        assert c.finish_reason == "length" and len(c.token_ids) == 40 == len(c.logprobs)
        assert c.versions == [(v, 0, 40)] and all(c.loss_mask)
        gaps.append(max_gap(c.logprobs, hf_logprobs(hf_models[0], prompt_ids, c.token_ids, temperature, top_p)))
    print(f"max |vLLM - HF| log-prob gap (T={temperature}, top_p={top_p}): {max(gaps):.2e}")
    assert max(gaps) < TOL


def test_raw_logprobs_would_differ_at_low_temperature(engine, loop, prompt_ids, hf_models):
    """Sanity for the reference: at T=0.7 the processed log-probs are not the raw (T=1) ones."""
    c = loop.run(engine.generate(prompt_ids, 1, max_tokens=20, temperature=0.7, ignore_eos=True,
                                 sample_seed=5))[0]
    assert max_gap(c.logprobs, hf_logprobs(hf_models[0], prompt_ids, c.token_ids, 1.0)) > 1e-2


def test_sampling_seed_reproducible(engine, loop, prompt_ids):
    a = loop.run(engine.generate(prompt_ids, 2, max_tokens=20, ignore_eos=True, sample_seed=7))
    b = loop.run(engine.generate(prompt_ids, 2, max_tokens=20, ignore_eos=True, sample_seed=7))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert a[0].token_ids != a[1].token_ids


def _vllm_detokenized(engine, loop, prompt_ids, seeds, **params) -> list[tuple[list[int], str, str]]:
    """(token ids, text, finish reason) of seeded requests with vLLM's own per-token detokenizer, on the engine
    thread (nothing else runs in these tests)."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import SamplingParams

    def run(llm):
        for s in seeds:
            llm.add_request(f"ref-{s}", TokensPrompt(prompt_token_ids=prompt_ids),
                            SamplingParams(n=1, logprobs=0, seed=s, **params))
        done = {}
        while llm.has_unfinished_requests():
            for out in llm.step():
                if out.finished:
                    done[out.request_id] = (list(out.outputs[0].token_ids), out.outputs[0].text,
                                            out.outputs[0].finish_reason)
        return [done[f"ref-{s}"] for s in seeds]

    return loop.run(engine._call(run))


@pytest.mark.parametrize("stop", ["eos", "stop_token", "length"])
def test_text_is_what_vllms_detokenizer_gives(engine, loop, prompt_ids, stop):
    """Requests skip vLLM's per-token detokenizer; the text decoded once at the end must equal its output, with a
    stop token's text left out as vLLM leaves it out."""
    seeds = [40 + i for i in range(6)]
    kwargs = {"eos": {}, "length": {"ignore_eos": True}}.get(stop)
    if stop == "stop_token":  # a token these seeds do sample, whatever the model: the first of the first completion
        sampled = _vllm_detokenized(engine, loop, prompt_ids, seeds, max_tokens=12, ignore_eos=True)[0][0]
        kwargs = {"stop_token_ids": [next(t for t in sampled if t != engine.tokenizer.eos_token_id)]}
    ours = loop.run(engine.generate(prompt_ids, 6, max_tokens=12, sample_seed=40, **kwargs))
    ref = _vllm_detokenized(engine, loop, prompt_ids, seeds, max_tokens=12, **kwargs)
    assert [(c.token_ids, c.text, c.finish_reason) for c in ours] == ref
    ended = {"eos": engine.tokenizer.eos_token_id, "stop_token": kwargs.get("stop_token_ids", [None])[0]}.get(stop)
    if ended is None:
        assert any(r[2] == "length" for r in ref)
    else:  # the case is exercised: some request ended on that very token
        assert any(r[2] == "stop" and r[0][-1] == ended for r in ref)


# ---------------------------------------------------------------------- in-flight updates
def test_inflight_update_keep(base_engine, loop, prompt_ids, states, hf_models):
    engine = base_engine
    old, new = engine.current_version, engine.current_version + 1
    res, pause, err = _inflight(engine, loop, prompt_ids, states[1], new, "keep")
    assert err is None and engine.current_version == new
    assert 0 < pause < 5
    assert loop.run(engine.weight_version_label()) == str(new)
    gaps_keep, gaps_new, gaps_old = [], [], []
    for c in res:
        assert c.finish_reason == "length" and len(c.token_ids) == 100, "completion dropped or cut"
        k = _switch(c, old, new)
        ref = hf_keep_logprobs(hf_models[0], hf_models[1], prompt_ids, c.token_ids, k)
        gaps_keep.append(max_gap(c.logprobs, ref))
        gaps_new.append(max_gap(c.logprobs[k:], hf_logprobs(hf_models[1], prompt_ids, c.token_ids)[k:]))
        gaps_old.append(max_gap(c.logprobs[k:], hf_logprobs(hf_models[0], prompt_ids, c.token_ids)[k:]))
    print(f"keep: gap vs keep-reference {max(gaps_keep):.2e}, vs pure new {min(gaps_new):.2e}, "
          f"vs pure old {min(gaps_old):.2e}; pause {pause:.3f}s")
    assert max(gaps_keep) < TOL
    assert min(gaps_new) > 100 * TOL and min(gaps_old) > 100 * TOL


def test_inflight_update_recompute(base_engine, loop, prompt_ids, states, hf_models):
    engine = base_engine
    old, new = engine.current_version, engine.current_version + 1
    res, pause, err = _inflight(engine, loop, prompt_ids, states[1], new, "recompute", seed=12)
    assert err is None and engine.current_version == new
    gaps_pre, gaps_post = [], []
    for c in res:
        assert c.finish_reason == "length" and len(c.token_ids) == 100
        k = _switch(c, old, new)
        gaps_pre.append(max_gap(c.logprobs[:k], hf_logprobs(hf_models[0], prompt_ids, c.token_ids)[:k]))
        gaps_post.append(max_gap(c.logprobs[k:], hf_logprobs(hf_models[1], prompt_ids, c.token_ids)[k:]))
    print(f"recompute: gap before switch vs old {max(gaps_pre):.2e}, after switch vs new {max(gaps_post):.2e}; "
          f"pause {pause:.3f}s")
    assert max(gaps_pre) < TOL and max(gaps_post) < TOL


def test_idle_update_relabels_new_requests(base_engine, loop, prompt_ids, states, hf_models):
    engine = base_engine
    new = engine.current_version + 1
    loop.run(engine.update_weights(states[1], new, kv_cache="recompute"))
    c = loop.run(engine.generate(prompt_ids, 1, max_tokens=30, ignore_eos=True, sample_seed=1))[0]
    assert c.versions == [(new, 0, 30)]
    assert max_gap(c.logprobs, hf_logprobs(hf_models[1], prompt_ids, c.token_ids)) < TOL
    with pytest.raises(ValueError):
        loop.run(engine.update_weights(states[1], new + 1, kv_cache="drop"))


def test_update_from_what_a_transport_hands_over(base_engine, loop, states, tmp_path):
    """Received safetensors bytes (gRPC), a file the worker reads (filesystem) and (name, tensor) pairs load
    the same weights as the dict."""
    import hashlib

    from safetensors.torch import save, save_file

    from scalerl.weights.codec import SafetensorsBlob, SafetensorsFile

    engine = base_engine
    version = engine.current_version
    loop.run(engine.update_weights(states[1], version + 1))
    expected = _checksum(engine, loop)
    loop.run(engine.update_weights(states[0], version + 2))
    assert _checksum(engine, loop) != expected
    blob = save(states[1])
    save_file(states[1], tmp_path / "v.safetensors")
    for i, weights in enumerate([SafetensorsBlob("job", 0, blob, hashlib.sha256(blob).hexdigest()),
                                 SafetensorsFile("job", 0, str(tmp_path / "v.safetensors")),
                                 list(states[1].items())]):
        loop.run(engine.update_weights(states[0], version + 3 + 2 * i))
        loop.run(engine.update_weights(weights, version + 4 + 2 * i))
        assert _checksum(engine, loop) == expected, type(weights).__name__
        assert engine.current_version == version + 4 + 2 * i


# ---------------------------------------------------------------------- failed loads
def _bad_weights(states) -> dict:
    """Bad updates: blobs as the gRPC transport hands them over (corrupt, truncated) and named tensors."""
    import hashlib

    from safetensors.torch import save

    from scalerl.weights.codec import SafetensorsBlob

    def received(blob: bytes) -> SafetensorsBlob:
        return SafetensorsBlob("job", 99, blob, hashlib.sha256(blob).hexdigest())

    state = states[1]
    blob = save(state)
    name = next(iter(state))
    renamed = dict(state)
    renamed["model.not_a_layer.weight"] = renamed.pop(name)
    reshaped = dict(state)
    reshaped[name] = reshaped[name][..., :-1].contiguous()
    missing = dict(state)
    missing.pop(name)
    integer = dict(state)
    integer[name] = integer[name].to(torch.int32)
    return {"corrupt": received(b"\x00\x01garbage" * 10), "truncated": received(blob[: len(blob) // 2]),
            "renamed": renamed, "reshaped": reshaped, "missing": missing, "integer": integer,
            "empty": {}, "bytes": blob}


def test_failed_load_rejected_before_pause(base_engine, loop, prompt_ids, states, hf_models):
    engine = base_engine
    version, checksum = engine.current_version, _checksum(engine, loop)
    for kind, weights in _bad_weights(states).items():
        with pytest.raises(WeightUpdateError):
            loop.run(engine.update_weights(weights, version + 1))
        assert engine.current_version == version, kind
        assert loop.run(engine.weight_version_label()) == str(version), kind
    assert _checksum(engine, loop) == checksum
    c = loop.run(engine.generate(prompt_ids, 1, max_tokens=30, ignore_eos=True, sample_seed=2))[0]
    assert c.versions == [(version, 0, 30)]
    assert max_gap(c.logprobs, hf_logprobs(hf_models[0], prompt_ids, c.token_ids)) < TOL


def test_failed_load_in_worker_while_in_flight(base_engine, loop, prompt_ids, states, hf_models):
    """Weights whose names, shapes and dtypes are fine but whose values are not (NaN) fail in the worker,
    mid-generation."""
    engine = base_engine
    state = {name: t.clone() for name, t in states[1].items()}
    state[next(iter(state))].view(-1)[0] = float("nan")
    version, checksum = engine.current_version, _checksum(engine, loop)
    res, _, err = _inflight(engine, loop, prompt_ids, state, version + 1, "recompute", seed=13)
    assert isinstance(err, WeightUpdateError) and "non-finite" in str(err)
    assert engine.current_version == version
    assert loop.run(engine.weight_version_label()) == str(version)
    assert _checksum(engine, loop) == checksum
    for c in res:
        assert c.finish_reason == "length" and len(c.token_ids) == 100
        assert c.versions == [(version, 0, 100)]
        assert max_gap(c.logprobs, hf_logprobs(hf_models[0], prompt_ids, c.token_ids)) < TOL
    # A path the worker cannot read fails the same way.
    with pytest.raises(WeightUpdateError):
        loop.run(engine.update_weights("/nonexistent/model.safetensors", version + 1))
    assert engine.current_version == version


# ---------------------------------------------------------------------- forced interruption
def test_forced_interruption(engine, loop, prompt_ids, hf_models):
    phrase_ids = engine.tokenizer(DEFAULT_INTERRUPTION_PHRASE, add_special_tokens=False)["input_ids"]
    assert engine.tokenizer.bos_token_id not in phrase_ids
    res = loop.run(engine.generate(prompt_ids, 4, max_tokens=20, thinking_budget=(5, 10), solution_budget=12,
                                   interruption_phrase=DEFAULT_INTERRUPTION_PHRASE, ignore_eos=True,
                                   request_id="intr", sample_seed=4))
    v = engine.current_version
    budgets = [draw_budget((5, 10), seed=engine.seed, request_id="intr", index=i) for i in range(4)]
    for i, c in enumerate(res):
        k = c.interrupted_at
        assert c.finish_reason == "interrupted" and k == budgets[i]
        assert c.token_ids[k:k + len(phrase_ids)] == phrase_ids
        assert len(c.token_ids) == k + len(phrase_ids) + 12, "the answer must follow the phrase"
        assert c.loss_mask == [True] * k + [False] * len(phrase_ids) + [True] * 12
        assert c.logprobs[k:k + len(phrase_ids)] == [0.0] * len(phrase_ids)
        assert c.versions == [(v, 0, len(c.token_ids))]
        thinking = engine.tokenizer.decode(c.token_ids[:k], skip_special_tokens=True)
        assert c.text.startswith(thinking + DEFAULT_INTERRUPTION_PHRASE) and len(c.text) > len(thinking) + len(
            DEFAULT_INTERRUPTION_PHRASE)
        # The answer's log-probs are the model's, conditioned on prompt + thinking + phrase.
        ref = hf_logprobs(hf_models[0], prompt_ids, c.token_ids)
        mask = c.loss_mask
        assert max_gap([x for x, m in zip(c.logprobs, mask) if m], [x for x, m in zip(ref, mask) if m]) < TOL


def test_no_interruption_when_stopped_before_budget(engine, loop, prompt_ids):
    digits = [engine.tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]
    res = loop.run(engine.generate(prompt_ids, 4, max_tokens=30, thinking_budget=(20, 25), solution_budget=10,
                                   interruption_phrase=DEFAULT_INTERRUPTION_PHRASE, stop_token_ids=digits,
                                   sample_seed=6))
    for c in res:
        assert c.finish_reason == "stop" and c.interrupted_at is None and all(c.loss_mask)
        assert DEFAULT_INTERRUPTION_PHRASE not in c.text


@pytest.fixture
def added_requests(engine, monkeypatch):
    """The sampling params of every request handed to the real vLLM engine (counted, then passed on)."""
    seen: list = []
    add = engine._llm.add_request

    def counting(request_id, prompt, params, *args, **kwargs):
        seen.append(params)
        return add(request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(engine._llm, "add_request", counting)
    return seen


def test_completions_with_one_cap_share_a_request(engine, loop, prompt_ids, hf_models, added_requests):
    """Without per-completion seeds or streams, the n completions go as one vLLM request of n sequences:
    independent samples, each with its own log-probs (the model's), versions and finish reason, in order."""
    res = loop.run(engine.generate(prompt_ids, 6, max_tokens=30, ignore_eos=True))
    assert [p.n for p in added_requests] == [6]
    v = engine.current_version
    assert len(res) == 6 and len({tuple(c.token_ids) for c in res}) > 1, "not independent samples"
    for c in res:
        assert c.finish_reason == "length" and len(c.token_ids) == 30 == len(c.logprobs)
        assert c.versions == [(v, 0, 30)] and all(c.loss_mask) and c.interrupted_at is None
        assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        assert max_gap(c.logprobs, hf_logprobs(hf_models[0], prompt_ids, c.token_ids)) < TOL


def test_interruption_with_shared_requests_cuts_each_at_its_own_budget(engine, loop, prompt_ids, hf_models,
                                                                       added_requests):
    """Budgets from [5, 7] for 8 completions: those drawing the same budget share a request; each is still cut
    at exactly its own budget and answers after the phrase."""
    phrase_ids = engine.tokenizer(DEFAULT_INTERRUPTION_PHRASE, add_special_tokens=False)["input_ids"]
    res = loop.run(engine.generate(prompt_ids, 8, max_tokens=20, thinking_budget=(5, 7), solution_budget=6,
                                   interruption_phrase=DEFAULT_INTERRUPTION_PHRASE, ignore_eos=True,
                                   request_id="shared-intr"))
    budgets = [draw_budget((5, 7), seed=engine.seed, request_id="shared-intr", index=i) for i in range(8)]
    assert len(set(budgets)) < 8, "pick a request id whose budgets repeat, so some completions share a request"
    first = added_requests[:len(set(budgets))]  # every first request is queued before any continuation
    assert sorted((p.max_tokens, p.n) for p in first) == sorted((b, budgets.count(b)) for b in set(budgets))
    assert len(added_requests) == len(set(budgets)) + 8  # then one continuation per completion
    for i, c in enumerate(res):
        k = c.interrupted_at
        assert c.finish_reason == "interrupted" and k == budgets[i]
        assert c.token_ids[k:k + len(phrase_ids)] == phrase_ids and len(c.token_ids) == k + len(phrase_ids) + 6
        assert c.loss_mask == [True] * k + [False] * len(phrase_ids) + [True] * 6
        ref = hf_logprobs(hf_models[0], prompt_ids, c.token_ids)
        assert max_gap([x for x, m in zip(c.logprobs, c.loss_mask) if m],
                       [x for x, m in zip(ref, c.loss_mask) if m]) < TOL


def test_budget_draw_reproducible_and_uniform_range():
    draws = [draw_budget((10, 12), seed=0, request_id="r", index=i) for i in range(200)]
    assert set(draws) == {10, 11, 12}
    assert draws == [draw_budget((10, 12), seed=0, request_id="r", index=i) for i in range(200)]
    assert draws != [draw_budget((10, 12), seed=1, request_id="r", index=i) for i in range(200)]
    with pytest.raises(ValueError):
        draw_budget((5, 4), seed=0, request_id="r", index=0)


def test_merge_spans():
    assert merge_spans([(1, 0, 3), (1, 3, 5), (2, 5, 5), (2, 5, 9), (1, 9, 10)]) == [(1, 0, 5), (2, 5, 9),
                                                                                       (1, 9, 10)]


class _ScriptedEngine(GenerationEngine):
    """No vLLM: _run returns scripted parts, to exercise the interruption branches."""

    def __init__(self, tokenizer, parts):
        super().__init__("unused", max_model_len=1000)
        self._tokenizer, self._llm, self._parts, self.calls = tokenizer, object(), list(parts), []

    async def _run(self, prompt_token_ids, params, request_id, on_tokens=None):
        self.calls.append((list(prompt_token_ids), params.max_tokens, request_id))
        return self._parts.pop(0)


def test_interruption_branches_scripted(tiny_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models[0])
    phrase = " Time is up. </think>"
    ph = tok(phrase, add_special_tokens=False)["input_ids"]
    think = tok("abc </think> 4", add_special_tokens=False)["input_ids"]
    budget = draw_budget((len(think), len(think)), seed=0, request_id="s", index=0)

    def run(parts, **kw):
        eng = _ScriptedEngine(tok, parts)
        kw.setdefault("max_tokens", 40)
        out = asyncio.run(eng.generate([1, 5], 1, thinking_budget=(budget, budget), solution_budget=7,
                                       interruption_phrase=phrase, request_id="s", **kw))[0]
        return out, eng.calls

    # "</think>" already emitted when the budget is reached: continue without the phrase, up to max_tokens.
    out, calls = run([_Part(think, [-1.0] * budget, [(3, 0, budget)], "length"),
                      _Part([9, 9], [-0.5, -0.5], [(4, 0, 2)], "stop")])
    assert calls[1][0] == [1, 5] + think and calls[1][1] == 40 - budget
    assert out.finish_reason == "stop" and out.interrupted_at is None and all(out.loss_mask)
    assert out.versions == [(3, 0, budget), (4, budget, budget + 2)]
    # Budget reached while thinking: the phrase is injected and labelled with the continuation's version.
    plain = [7] * budget
    out, calls = run([_Part(plain, [-1.0] * budget, [(3, 0, budget)], "length"),
                      _Part([9, 9, 9], [-0.5] * 3, [(4, 0, 3)], "length")])
    assert calls[1][0] == [1, 5] + plain + ph and calls[1][1] == 7
    assert out.finish_reason == "interrupted" and out.interrupted_at == budget
    assert out.versions == [(3, 0, budget), (4, budget, budget + len(ph) + 3)]
    assert out.logprobs == [-1.0] * budget + [0.0] * len(ph) + [-0.5] * 3
    # max_tokens below the budget: a plain "length" completion, no continuation.
    out, calls = run([_Part(plain[:5], [-1.0] * 5, [(3, 0, 5)], "length")], max_tokens=5)
    assert len(calls) == 1 and calls[0][1] == 5 and out.finish_reason == "length"
    # Aborted continuation.
    out, _ = run([_Part(plain, [-1.0] * budget, [(3, 0, budget)], "length"),
                  _Part([], [], [], "aborted")])
    assert out.finish_reason == "aborted"


def _sentencepiece_style_tokenizer():
    """Word pieces that carry their leading space ("▁is"), decoded as SentencePiece models (Llama 2, Mistral) do:
    a piece decoded on its own loses that space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["▁the", "▁answer", "▁is", "▁60", "▁</think>", "▁so"]
    raw = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2} | {w: i + 3 for i, w in enumerate(words)},
                                     unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_a_continued_completion_is_decoded_whole():
    """The text of a completion made of two requests is its token ids decoded together: decoding each request's
    tokens alone and joining the texts glues words for SentencePiece tokenizers ("answeris")."""
    tok = _sentencepiece_style_tokenizer()
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731

    def part(token_ids, finish):
        return _Part(token_ids, [-1.0] * len(token_ids), [(0, 0, len(token_ids))], finish)

    def generate(first, rest):
        eng = _ScriptedEngine(tok, [first, rest])
        return asyncio.run(eng.generate([1], 1, max_tokens=40, thinking_budget=(2, 2), solution_budget=7,
                                        interruption_phrase=" </think>", request_id="sp"))[0]

    eos = tok.eos_token_id
    interrupted = generate(part(ids("the answer"), "length"), part(ids("is 60") + [eos], "stop"))
    assert interrupted.finish_reason == "interrupted"
    whole = tok.decode(interrupted.token_ids, skip_special_tokens=True)
    assert interrupted.text == "the answer </think> is 60" == whole
    thought = generate(part(ids("so </think>"), "length"), part(ids("the answer is 60"), "length"))
    assert thought.finish_reason == "length" and thought.text == "so </think> the answer is 60"


@pytest.mark.parametrize("fp32_lm_head", [True, False])
def test_engine_config(tiny_models, fp32_lm_head):
    """The vLLM config: processed log-probs, fp32 head only when asked, our worker extension."""
    eng = GenerationEngine(str(tiny_models[0]), dtype="bfloat16", fp32_lm_head=fp32_lm_head)
    cfg = eng.engine_args().create_engine_config()
    assert cfg.model_config.logprobs_mode == "processed_logprobs"
    assert cfg.model_config.head_dtype == (torch.float32 if fp32_lm_head else torch.bfloat16)
    assert cfg.parallel_config.worker_extension_cls == "scalerl_generator.worker_ext.WeightLoaderExtension"
