"""Expert iteration on arith with a scripted teacher on loopback: are unsolved problems
recovered, is anything trained on free of hints and leaked answers, and what hint reliance?

usage: uv run python benchmarks/ei_scripted_teacher.py [RUN_DIR] [key=value ...]
       (scenario=arith_retry: multi-turn episodes; every turn of every distilled one is checked)

The teacher is a `ScriptedServer` (a real OpenAI-compatible HTTP server on 127.0.0.1, called
through litellm) that answers the first request with a reply that leaks every possible answer (refused, asked
again), then every request with one of two non-leaking hints, in turn. The student is the embedded model. Prints a JSON report.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")

HINTS = [
    "Compute it step by step; the result is a whole number. Reply with only that number.",
    "Start from the first number and count; answer with the number alone, no words.",
]


def main(run_dir: Path, extra: list[str]) -> dict:
    from art_rlvr.ei.data import RoundBuffer
    from art_rlvr.run import main as run_main
    from art_rlvr.scenarios.leakage import leaks
    from art_rlvr.scenarios.scenario import load_scenario
    from art_rlvr.testing import ScriptedServer, Step

    os.environ["SCRIPTED_TEACHER_KEY"] = "sk-scripted-teacher"
    scenario = next((a.split("=", 1)[1] for a in extra if a.startswith("scenario=")), "arith")
    # first a reply that names every possible arith answer (0..40), which must be refused and
    # regenerated, then the hints in turn
    leak = "It is one of " + ", ".join(str(i) for i in range(41)) + "."
    steps = [Step.reply(leak)] + [Step.reply(h) for h in HINTS] * 200
    with ScriptedServer(steps, default=Step.reply(HINTS[0])) as server:
        defaults = {
            "scenario": scenario,
            "mode": "ei",
            "seed": "0",
            "run_dir": str(run_dir),
            "enable_teacher_hints": "true",
            "teacher.model": "openai/scripted-teacher",
            "teacher.api_base": server.base_url,
            "teacher.api_key_env": "SCRIPTED_TEACHER_KEY",
            "rounds": "2",
            "scenarios_per_round": "16",
            "group_size": "2",
            "hinted_samples_per_x": "4",
            "val_limit": "50",
            "eval_test": "false",
        }
        given = dict(a.split("=", 1) for a in extra)  # key=value arguments override these
        argv = [f"{k}={v}" for k, v in (defaults | given).items()]
        code = run_main(argv)
        teacher_requests = len(server.chat_requests)
    if code != 0:
        raise SystemExit(code)
    task = load_scenario(scenario, seed=0)
    by_id = {sc.id: sc for sc in task.splits["train"]}
    hint_texts: set[str] = set()
    examples = []
    for path in sorted((run_dir / "ei").glob("round_*.json")):
        buffer = RoundBuffer.model_validate_json(path.read_text())
        hint_texts |= {h.hint for h in buffer.hints if h.hint}
        hint_texts |= {a.text for h in buffer.hints for a in h.attempts if a.text}
        examples += list(buffer.examples)
    accepted_hints_leaking = 0
    for path in sorted((run_dir / "ei").glob("round_*.json")):
        buffer = RoundBuffer.model_validate_json(path.read_text())
        for h in buffer.hints:
            if h.hint and leaks(h.hint, by_id[h.scenario_id].x["answer"]):
                accepted_hints_leaking += 1
    from art_rlvr.core.outcome import turns
    from art_rlvr.ei.relabel import hint_leaks, message_text, relabel

    # what SFT trains on, every turn of it
    trained = [(e, relabel(e)) for e in examples]
    with_hint_text = sum(
        any(text in message_text(m) for m in turns(t) for text in hint_texts) for _, t in trained
    )
    assistant_turns = [sum(m["role"] == "assistant" for m in turns(t)) for _, t in trained]
    echoing = sum(
        e.source == "hinted" and any(hint_leaks(t, h, len(e.messages)) for h in hint_texts)
        for e, t in trained
    )
    not_clean = sum(list(e.messages) != by_id[e.scenario_id].messages(None) for e in examples)
    prompt_leaks = sum(
        leaks(json.dumps(list(e.messages)), by_id[e.scenario_id].x["answer"])
        and not leaks(
            by_id[e.scenario_id].messages(None)[-1]["content"], by_id[e.scenario_id].x["answer"]
        )
        for e in examples
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"ei_round"' in line
    ]
    report = {
        "teacher_requests": teacher_requests,
        "rounds": [
            {
                k: r[k]
                for k in (
                    "round",
                    "clean_solve_rate",
                    "hints_requested",
                    "hints_generated",
                    "hints_leak_rejected",
                    "hints_dropped",
                    "teacher_errors",
                    "hinted_echo_rejected",
                    "hinted_solve_rate",
                    "recovered",
                    "examples_distilled",
                    "examples_from_hints",
                    "hint_reliance_mean",
                    "hint_reliance_per_token",
                )
            }
            for r in rounds
        ],
        "distilled_examples": len(examples),
        "distilled_from_hints": sum(e.source == "hinted" for e in examples),
        "distilled_multi_turn": sum(n > 1 for n in assistant_turns),
        "distilled_assistant_turns": sum(assistant_turns),
        "distilled_with_hint_text": with_hint_text,
        "distilled_hinted_episodes_quoting_a_hint": echoing,
        "distilled_with_non_clean_prompt": not_clean,
        "distilled_prompts_leaking_answer": prompt_leaks,
        "accepted_hints_leaking_answer": accepted_hints_leaking,
        "summary": {
            k: summary.get(k)
            for k in (
                "val_accuracy_before",
                "val_accuracy_after",
                "recovered",
                "hints_leak_rejected",
                "hint_reliance_mean",
                "wall_seconds",
            )
        },
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    args = sys.argv[1:]
    folder = Path(args.pop(0)) if args and "=" not in args[0] else Path("runs/arith-ei-teacher")
    main(folder, args)
