#!/usr/bin/env bash
# The five ablations on arith with the embedded model, same seed(s), a budget that fits 2 CPU
# cores, one after the other (so wall times compare), then the table:
#   bash benchmarks/ablation_matrix.sh [SEEDS...]        (default: seed 0)
# Budget per run: 288 training rollouts of the policy (RL: 8 steps x 6 groups x 6; EI: 3 rounds
# x 16 scenarios x 6 attempts); GEPA+RL spends 4 RL steps per round over 2 rounds plus 2 GEPA
# phases of at most 64 metric calls each (reflection by the embedded model: no key needed).
# Results land in runs/abl-*; a killed script re-run resumes each run where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=("${@:-0}")
run() {  # a finished run (summary.json present) is not re-entered: its wall time stays its own
  local name="$1"; shift
  [[ -f "runs/$name/summary.json" ]] && { echo "runs/$name is finished"; return; }
  python3 -m uv run --locked python -m art_rlvr.run scenario=arith eval_test=true \
      run_name="$name" "$@"
}
GEPA=(max_metric_calls=64 pareto_size=8 traces_per_iteration=4 gepa.group_size=2
      reflection.max_tokens=256 reflection.timeout_s=600 report_val_limit=0)
for seed in "${SEEDS[@]}"; do
  run "abl-rl-s$seed" seed="$seed" mode=rl n_batches=8 eval_every=8
  run "abl-gepa_rl-s$seed" seed="$seed" mode=gepa_rl rounds=2 \
      rl_batches_per_round=4 "${GEPA[@]}"
  run "abl-ei-s$seed" seed="$seed" mode=ei rounds=3 eval_every_rounds=3
  run "abl-ei_hints-s$seed" seed="$seed" mode=ei rounds=3 eval_every_rounds=3 \
      enable_teacher_hints=true
  run "abl-gepa_rl_ei-s$seed" seed="$seed" mode=gepa_rl_ei rounds=2 \
      rl_batches_per_round=4 scenarios_per_round=8 "${GEPA[@]}"
done
python3 -m uv run --locked python -m art_rlvr.compare runs/abl-*
