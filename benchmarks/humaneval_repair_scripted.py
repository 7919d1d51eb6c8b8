"""humaneval_repair with a scripted policy that fails the first round and repairs on the second:
does the loop carry a failure to a fix? (The embedded 135M model passes almost nothing, so its
own figure cannot show that.)

usage: uv run python benchmarks/humaneval_repair_scripted.py [SPLIT] [LIMIT]

The policy is a `ScriptedServer` (a real OpenAI-compatible HTTP server on 127.0.0.1) that
answers round 1 with the task's prompt and a `return None` body, and round 2 with the prompt
and the canonical solution; every reply runs in the real sandbox through the real environment.
Prints a JSON report: pass rate after round 1 and after up to 3 rounds, rounds used, and the
environment's message after a failed first round, for the first task.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")


async def main(split: str, limit: int) -> dict:
    import art

    from art_rlvr import load_scenario
    from art_rlvr.rollouts.rollout import rollout
    from art_rlvr.testing import ScriptedServer, Step

    scenario = load_scenario("humaneval_repair", seed=0)
    examples = scenario.splits[split][:limit]
    started = time.monotonic()
    results, first_message = [], None
    for sc in examples:
        prompt = sc.x["prompt"]
        wrong = f"```python\n{prompt}    return None\n```"
        fixed = f"```python\n{prompt}{sc.x['canonical_solution']}```"
        with ScriptedServer([Step.reply(wrong), Step.reply(fixed)]) as server:
            model = art.Model(
                name="scripted", project="bench", inference_base_url=server.base_url,
                inference_api_key="k", inference_model_name="scripted",
            )  # fmt: skip
            t = await rollout(model, sc)
            if first_message is None and len(server.chat_requests) > 1:
                first_message = server.chat_requests[1].last_user_text
        results.append(t.metrics)
    n = len(results)
    return {
        "policy": "scripted: wrong on round 1, the canonical solution on round 2",
        "split": split,
        "n": n,
        "pass_after_1_round": sum(m["first_round_correct"] for m in results) / n,
        "pass_after_3_rounds": sum(m["correct"] for m in results) / n,
        "mean_rounds": sum(m["rounds"] for m in results) / n,
        "sandbox_errors": sum(m["sandbox_errors"] for m in results),
        "sandbox_timeouts": sum(m["sandbox_timeouts"] for m in results),
        "env_errors": sum(m["env_error"] for m in results),
        "seconds": round(time.monotonic() - started, 1),
        "message_after_round_1": first_message,
    }


if __name__ == "__main__":
    split = sys.argv[1] if len(sys.argv) > 1 else "val"
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 10**6
    print(json.dumps(asyncio.run(main(split, limit)), indent=1))
