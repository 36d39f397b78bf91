# Policy weights at scale (helper area: shared/scalerl/weights, services/weight-broadcast). Included by the Makefile.

.PHONY: bench-weights-delta bench-weights-scale test-weight-transports

bench-weights-delta: $(STAMP) ## bytes changed per optimizer step on the tiny model (bf16 / fp32) and what a delta sends
	$(PY) bench/weights_bench.py --skip-wire --delta

bench-weights-scale: $(STAMP) ## model: 16 GB to 64 generators through the relay (RATIO= the measured per-hop ratio)
	$(PY) bench/weights_at_scale.py --ratio $(or $(RATIO),0.7) --chunk-mib 1 16 --fanout 1 2 4

test-weight-transports: $(STAMP) ## one in-flight update through each transport (grpc, filesystem, torch_distributed)
	$(PYTEST) e2e_tests/test_weight_transports.py -m e2e
