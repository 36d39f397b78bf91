"""kv_cache_on_update=keep on the real vLLM CPU engine: after a weight update, a *new* request whose prompt was
seen before must not reuse prefix-cache blocks the old weights computed (issue 14 d), while a request running
through the update keeps its own KV (PipelineRL's behaviour). The session engine has 32-token KV blocks; the
prompt has 61 tokens, so its first block is prefix-cached."""

from __future__ import annotations

import asyncio


from test_engine import TOL, _wait_all, hf_keep_logprobs, hf_logprobs, max_gap

LONG_PROMPT = "12+7=" * 12


def _cached_blocks(engine, loop) -> int:
    def count(llm) -> int:
        return len(llm.engine_core.engine_core.scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block)

    return loop.run(engine._call(count))


def test_idle_update_keep_forgets_the_prefix_cache(base_engine, loop, states, hf_models):
    engine = base_engine
    ids = engine.tokenizer(LONG_PROMPT)["input_ids"]
    assert len(ids) > 32
    loop.run(engine.update_weights(states[0], engine.current_version + 1, kv_cache="recompute"))
    loop.run(engine.generate(ids, 2, max_tokens=8, ignore_eos=True, sample_seed=1))
    assert _cached_blocks(engine, loop) > 0  # the prompt's first block is cached under the old weights
    new = engine.current_version + 1
    loop.run(engine.update_weights(states[1], new, kv_cache="keep"))
    assert _cached_blocks(engine, loop) == 0
    c = loop.run(engine.generate(ids, 1, max_tokens=20, ignore_eos=True, sample_seed=2))[0]
    assert c.versions == [(new, 0, 20)]
    assert max_gap(c.logprobs, hf_logprobs(hf_models[1], ids, c.token_ids)) < TOL


def test_update_keep_while_running_new_requests_start_fresh(base_engine, loop, states, hf_models):
    engine = base_engine
    ids = engine.tokenizer(LONG_PROMPT)["input_ids"]
    loop.run(engine.update_weights(states[0], engine.current_version + 1, kv_cache="recompute"))
    old, new = engine.current_version, engine.current_version + 1

    async def go():
        cb, started = _wait_all(1, 5)
        running = asyncio.ensure_future(engine.generate(ids, 1, max_tokens=60, ignore_eos=True, sample_seed=3,
                                                        on_tokens=cb))
        await asyncio.wait_for(started.wait(), 60)
        await engine.update_weights(states[1], new, kv_cache="keep")
        fresh = await engine.generate(ids, 1, max_tokens=20, ignore_eos=True, sample_seed=4)
        return (await running)[0], fresh[0]

    through, fresh = loop.run(go())
    # the request submitted after the update: the new weights' log-probs from the first token on
    assert fresh.versions == [(new, 0, 20)]
    assert max_gap(fresh.logprobs, hf_logprobs(hf_models[1], ids, fresh.token_ids)) < TOL
    # the request running through the update kept the KV the old weights computed
    assert [v for v, _, _ in through.versions] == [old, new]
    switch = through.versions[1][1]
    if switch < len(through.token_ids):
        ref = hf_keep_logprobs(hf_models[0], hf_models[1], ids, through.token_ids, switch)
        assert max_gap(through.logprobs, ref) < TOL
