# Kubernetes / container targets, included by the main Makefile (`include mk/k8s.mk`).
# Expects VENV (.venv) and PY ($(VENV)/bin/python) from the including Makefile; defaults here otherwise.
VENV ?= .venv
PY ?= $(VENV)/bin/python
TOOLS_BIN := tools/bin
HELM ?= $(TOOLS_BIN)/helm
PROMTOOL ?= $(shell command -v promtool 2>/dev/null || echo promtool)
HADOLINT ?= $(VENV)/bin/hadolint
CHART := helm/scalerl
GPU_VALUES := $(CHART)/examples/gpu-cluster.yaml
IMAGE_REGISTRY ?= ghcr.io/scalerl
IMAGE_TAG ?= dev
DOCKER ?= docker

# service:grpc-port:metrics-port
CPU_SERVICES := api:18050:9100 reward-grader:18052:9102 replay-buffer:18053:9103 forecaster:18055:9105 weight-broadcast:18056:9106
GPU_SERVICES := generator:18051:9101 learner:18054:9104

.PHONY: k8s-tools helm-lint helm-template dashboards dashboards-check hadolint promtool-check promtool-test \
        test-prometheus prometheus-config images images-check k8s-check

k8s-tools: ## install helm + kubectl into tools/bin, prometheus + promtool via apt if missing
	bash scripts/install_k8s_tools.sh

$(HELM):
	bash scripts/install_k8s_tools.sh

helm-lint: $(HELM) ## helm lint the chart with default values and the GPU-cluster example
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) -f $(GPU_VALUES)

helm-template: $(HELM) ## render the chart (default + GPU example) into build/helm/
	@mkdir -p build/helm
	$(HELM) template scalerl $(CHART) --namespace scalerl > build/helm/default.yaml
	$(HELM) template scalerl $(CHART) --namespace scalerl -f $(GPU_VALUES) > build/helm/gpu-cluster.yaml
	@echo "rendered build/helm/default.yaml build/helm/gpu-cluster.yaml"

dashboards: ## regenerate helm/scalerl/dashboards/*.json from scripts/gen_dashboards.py
	$(PY) scripts/gen_dashboards.py

dashboards-check: ## fail if committed dashboards are stale
	$(PY) scripts/gen_dashboards.py --check

hadolint: ## lint the Dockerfiles
	$(HADOLINT) docker/Dockerfile.cpu docker/Dockerfile.gpu

promtool-check: ## promtool check rules on the alert file
	$(PROMTOOL) check rules $(CHART)/files/alerts.rules.yaml

promtool-test: ## promtool test rules: every alert firing and not firing (helm/tests/alerts_test.yaml; in make test)
	$(PY) -m pytest -p no:cacheprovider -q helm/tests/test_alerts.py

test-prometheus: ## a real Prometheus scrapes the e2e stack: panels, alerts, buffer totals vs Redis (in make test)
	$(PY) -m pytest -p no:cacheprovider -q e2e_tests/test_prometheus.py

prometheus-config: ## print the scrape config (from the chart's ServiceMonitor) for a running `scalerl up`
	$(PY) e2e_tests/prometheus_support.py $${SCALERL_DATA_DIR:-var}/stack.json

images: ## docker build every service image (needs a Docker engine with BuildKit)
	@set -e; for s in $(CPU_SERVICES); do \
	  name=$${s%%:*}; rest=$${s#*:}; grpc=$${rest%%:*}; metrics=$${rest#*:}; \
	  echo "== $$name (cpu)"; \
	  DOCKER_BUILDKIT=1 $(DOCKER) build -f docker/Dockerfile.cpu --build-arg SERVICE=$$name \
	    --build-arg GRPC_PORT=$$grpc --build-arg METRICS_PORT=$$metrics \
	    -t $(IMAGE_REGISTRY)/$$name:$(IMAGE_TAG) . ; \
	done; \
	for s in $(GPU_SERVICES); do \
	  name=$${s%%:*}; rest=$${s#*:}; grpc=$${rest%%:*}; metrics=$${rest#*:}; \
	  echo "== $$name (gpu)"; \
	  DOCKER_BUILDKIT=1 $(DOCKER) build -f docker/Dockerfile.gpu --build-arg SERVICE=$$name \
	    --build-arg GRPC_PORT=$$grpc --build-arg METRICS_PORT=$$metrics \
	    -t $(IMAGE_REGISTRY)/$$name:$(IMAGE_TAG) . ; \
	done

images-check: $(STAMP) ## each image's package set in a clean venv (build/images/): imports what it runs, serves
	$(PY) scripts/images_check.py

k8s-check: helm-lint dashboards-check hadolint promtool-check promtool-test ## all static k8s checks + helm/tests
	$(PY) -m pytest -q helm/tests services/api/tests/test_scaler.py
