#!/usr/bin/env bash
# Every GPU check in one call of the device tool (a CUDA machine with torch but not our dependencies), within
# ~7 minutes on one H200. Here, first: `make gpu-wheels` (fills .whl/). Then, through the device tool, with
# `.whl` carried:   bash scripts/device_gpu_check.sh
# Results go to $OUT (the tool's folder that comes back): gpu_tests.log, gpu_check.json and .log, weights_bench.md.
set -u
out=${OUT:-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "device-gpu-check: the wheels did not install (run make gpu-wheels here first)"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD/shared:$PWD/services/learner:$PWD/services/weight-broadcast PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/nvidia-smi.txt"
python3 -c "import scalerl.weights.codec, scalerl_learner.trainer, scalerl_learner.fsdp_run, scalerl.models" \
  || { echo "device-gpu-check: an import failed (a wheel missing from scripts/gpu_wheels.py?)"; exit 4; }
timeout 150 python3 -m pytest -q -p no:cacheprovider services/learner/tests/test_on_cuda.py -m gpu 2>&1 \
  | tail -30 | tee "$out/gpu_tests.log"
timeout 240 python3 scripts/gpu_check.py --sections weights learner fsdp --section-timeout-s 120 \
  --out "$out/gpu_check.json" 2>&1 | grep -v "it/s\]" | tee "$out/gpu_check.log"
timeout 240 python3 bench/weights_bench.py --reps 5 --markdown --planes tcp --encode --delta-wire 0.0123 2>/dev/null \
  | grep "^|\|^Blob\|^Enc\|^Delta\|^CPU\|^Hash" | tee "$out/weights_bench.md"
timeout 90 python3 bench/learner_bench.py --mode publish --device cuda --hidden 4096 --steps 3 --rounds 1 2>/dev/null \
  | grep "^|\|^model\|^background" | tee "$out/publish_bench.md"
timeout 90 python3 bench/weights_bench.py --skip-wire --verify-threads 0 8 --reps 5 2>/dev/null \
  | grep "^|" | tee "$out/verify_threads.md"
