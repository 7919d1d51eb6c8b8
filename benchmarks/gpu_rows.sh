#!/usr/bin/env bash
# The GPU rows of docs/results.md, for a machine with one CUDA GPU (CI and the tests never need
# one), in one command that fits a short lease:
#   1. the engine next to HF batched `generate` at the same batch (32 / 128 / 256, 48 forced
#      tokens, 2 interleaved repeats; the engine in process, as HF is);
#   2. the ablation RL-only / GEPA (prompt only) / GEPA+RL / EI over the seeds given, with
#      benchmarks/ablation_matrix.sh's budgets, every run at once (one process a run, one CPU
#      thread each, the GPU shared: wall times are those of 4 x seeds runs side by side), then
#      `python -m art_rlvr.compare` over them.
#
#     bash benchmarks/gpu_rows.sh [OUT] [SEEDS...]     # default: runs/gpu-rows, seeds 0 1 2
#
# PYTHON=... names another interpreter; BATCHES, ENGINE_TIMEOUT and ABLATION_TIMEOUT (seconds)
# override the defaults. A run cut off by its timeout has no summary.json and `compare` lists
# it as unfinished.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-uv run python}
out=${1:-runs/gpu-rows}
shift || true
seeds=(0 1 2)
[[ $# -gt 0 ]] && seeds=("$@")
mkdir -p "$out/runs" "$out/logs"
$py -c "import torch; print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() \
else 'cpu (no CUDA device)', 'torch', torch.__version__)" | tee "$out/engine.txt"
# shellcheck disable=SC2086  # BATCHES is a list of numbers
timeout "${ENGINE_TIMEOUT:-240}" $py benchmarks/engine_speed.py --batches ${BATCHES:-32 128 256} \
    --tokens 48 --repeats 2 --no-cb --no-http 2>&1 | tee -a "$out/engine.txt"

GEPA=(max_metric_calls=64 pareto_size=8 traces_per_iteration=4 gepa.group_size=2
      reflection.max_tokens=256 reflection.timeout_s=600 report_val_limit=0)
declare -A MODE_ARGS=(
    [rl]="mode=rl n_batches=8 eval_every=8"
    [gepa]="mode=gepa ${GEPA[*]/max_metric_calls=64/max_metric_calls=128}"
    [gepa_rl]="mode=gepa_rl rounds=2 rl_batches_per_round=4 ${GEPA[*]}"
    [ei]="mode=ei rounds=3 eval_every_rounds=3"
)
started=$(date +%s)
for seed in "${seeds[@]}"; do
    for name in rl gepa gepa_rl ei; do
        dir="$out/runs/abl-$name-s$seed"
        # shellcheck disable=SC2086  # the mode's keys are words
        OMP_NUM_THREADS=1 timeout "${ABLATION_TIMEOUT:-330}" $py -m art_rlvr.run scenario=arith \
            eval_test=true "seed=$seed" "run_dir=$dir" ${MODE_ARGS[$name]} >"$out/logs/abl-$name-s$seed.log" 2>&1 &
    done
done
wait
echo "ablation: $((${#seeds[@]} * 4)) runs side by side in $(($(date +%s) - started)) s" \
    | tee "$out/compare.txt"
$py -m art_rlvr.compare "$out"/runs/abl-* 2>&1 | tee -a "$out/compare.txt"
tail -n 3 "$out"/logs/*.log >"$out/run_tails.txt"
