# The learner on real hardware (helper area: services/learner). Included by the Makefile.

.PHONY: test-distributed test-logprob-consistency bench-learner-memory bench-learner-ranks gpu-check gpu-wheels

test-distributed: $(STAMP) ## FSDP2 on CPU gloo: 2 ranks = 1 process, DCP resume on another world size, a rank killed mid-job
	$(PYTEST) services/learner/tests e2e_tests/test_learner_ranks.py -m distributed

test-logprob-consistency: $(STAMP) ## learner log-probs vs the vLLM engine's sampled tokens at T=0.7, top-p 0.9
	$(PYTEST) e2e_tests/test_logprob_consistency.py -m e2e

bench-learner-memory: $(STAMP) ## learner step time and peak memory vs batch size and micro-batch token budget
	$(PY) bench/learner_bench.py --mode memory --batch-prompts 4 8 16 32 --budgets 1000000000 1024
	$(PY) bench/learner_bench.py --mode memory --batch-prompts 4 16 32 --budgets 1000000000 --chunk-tokens 1000000000

bench-learner-ranks: $(STAMP) ## learner tokens/s, one process vs 2 gloo ranks (FSDP2)
	$(PY) bench/learner_bench.py --mode ranks --steps 8 --prompts 16 --generations 8 --completion-tokens 48

gpu-check: $(STAMP) ## one CUDA GPU, <= 8 min: the gpu tests, then learner bf16+FP32 head vs bare torch, FSDP, vLLM pause, weights -> JSON
	$(PYTEST) services/learner/tests -m gpu
	$(PY) scripts/gpu_check.py

gpu-wheels: $(STAMP) ## the wheels a CUDA torch image lacks for gpu-check, into .whl/ (carried to the GPU machine)
	$(PY) scripts/gpu_wheels.py
