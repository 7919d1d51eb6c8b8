"""GEPA budget discipline: metric calls used / budget over a matrix of configurations (goal:
never above 1.0), and proposals accepted per reflection call with a scripted reflector.

    uv run python benchmarks/gepa_budget.py [--quick]

The policy is the embedded model on TorchBackend (real rollouts on arith, 8 tokens each); the
reflector is a scripted OpenAI-compatible server on loopback that litellm calls over HTTP. It
proposes, in turn, instructions that help this model (reply with the bare number), instructions
that hurt it (reason at length, answer in French) and near-repeats, so acceptance is decided by
the minibatch scores, not by the script. One line per configuration, then the totals.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")

SEED = "Answer the question."
PROPOSALS = [
    "Explain your reasoning at length before you answer.",
    "Reply with only the final number.",
    "Answer in French, in a full sentence.",
    "You are a careful calculator. Reply with only the final number.",
    "Think step by step and show all of your work.",
    "Reply with only the final number!",
    "Output the result of the arithmetic and nothing else.",
    "Write a short poem about the question, then answer.",
]
# (max_metric_calls, pareto_size, traces_per_iteration, group_size, use_merge)
MATRIX = [
    (48, 4, 2, 2, False),
    (64, 4, 3, 2, True),
    (60, 8, 4, 1, False),
    (96, 6, 4, 2, True),
    (50, 2, 2, 3, False),
    (120, 8, 6, 2, True),
]
QUICK = MATRIX[:3]


async def main(matrix: list[tuple[int, int, int, int, bool]]) -> None:
    import art

    from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend, load_scenario
    from art_rlvr.gepa import GEPAConfig, optimize_prompt
    from art_rlvr.testing import ScriptedServer, Step

    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("BENCH_SCRIPTED_KEY", "sk-local")
    scenario = load_scenario("arith", seed=0)
    replies = [Step.reply(f"A better instruction:\n```\n{p}\n```") for p in PROPOSALS]
    # each configuration hears the proposals in its own rotation, over and over
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=Path(tmp) / ".art", seed=0)
        model = art.TrainableModel(
            name="budget", project="bench", run_name="budget", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        worst, calls, accepted = 0.0, 0, 0
        try:
            for n, (budget, pareto, m, k, merge) in enumerate(matrix):
                turn = replies[n % len(replies) :] + replies[: n % len(replies)]  # rotate
                with ScriptedServer(turn * 4) as server:
                    config = GEPAConfig(
                        reflection={
                            "model": "openai/scripted", "api_base": server.base_url,
                            "api_key_env": "BENCH_SCRIPTED_KEY",
                        },
                        max_metric_calls=budget,
                        pareto_size=pareto, traces_per_iteration=m, group_size=k,
                        use_merge=merge, max_tokens=8, temperature=0.7, report_val_limit=0,
                        seed=n,
                    )  # fmt: skip
                    result = await optimize_prompt(
                        model, scenario, seed_prompt=SEED, config=config, run_dir=Path(tmp) / str(n)
                    )
                summary = result.summary()
                ratio = result.metric_calls_used / budget
                worst = max(worst, ratio)
                calls += summary["reflection_calls"]
                accepted += summary["accepted"]
                per_call = summary["accepted"] / max(summary["reflection_calls"], 1)
                print(
                    f"budget {budget:3d} pareto {pareto} minibatch {m} x{k} merge {merge!s:5s}: "
                    f"used {result.metric_calls_used:3d} ({ratio:.2f} of budget), "
                    f"{result.iterations} iterations, {summary['reflection_calls']} reflection "
                    f"calls, {summary['accepted']} accepted ({per_call:.2f} per call), rejected "
                    f"{summary['rejected'] or '-'}, "
                    f"best {result.best_prompt!r}; stop: {result.stop_reason}",
                    flush=True,
                )
        finally:
            await backend.close()
    print(
        f"max used / budget {worst:.2f} (goal <= 1.00); accepted per reflection call "
        f"{accepted / max(calls, 1):.2f} ({accepted} of {calls})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 3 configurations")
    asyncio.run(main(QUICK if parser.parse_args().quick else MATRIX))
