#!/usr/bin/env bash
# TorchBackend on one CUDA GPU, for a machine that has one (CI and the tests never need it):
# the serving, rollout, training and load tests (their backend picks CUDA and bf16 by itself),
# the generation benchmark with a wider concurrency range, and the default arith RL run.
#
#     bash benchmarks/cuda_check.sh [run_dir]      # PYTHON=... to name another interpreter
set -euo pipefail
py=${PYTHON:-uv run python}
run_dir=${1:-runs/cuda-arith-rl-s0}
$py -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print('device:', torch.cuda.get_device_name(), 'torch', torch.__version__)"
$py -m pytest -q -p no:cacheprovider tests/backend/test_server.py tests/rollouts/test_rollout.py \
    tests/backend/test_train.py tests/backend/test_load.py || echo "pytest exit $?"
$py benchmarks/generation_throughput.py --repeats 3 --concurrency 1 8 32 128
$py -m art_rlvr.run scenario=arith seed=0 "run_dir=$run_dir"
$py -c "import json, sys; s = json.load(open(sys.argv[1] + '/summary.json')); \
print({k: s[k] for k in sorted(s) if not isinstance(s[k], (dict, list))})" "$run_dir"
