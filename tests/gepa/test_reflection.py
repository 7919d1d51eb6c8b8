"""What GEPA's reflection LM is shown (`gepa.reflection`): whole `arith_retry` episodes (every
turn, the environment's replies, reward and feedback), trimmed to a character budget
(`art_rlvr.core.transcript`, tested in tests/test_transcript.py); single-turn rows keep their old
form. Episodes are real: a scripted policy (or the embedded model) on loopback, through the
scenario's environment."""

from __future__ import annotations

import re

import art
import pytest

from art_rlvr.core.transcript import (
    episode_text,
    message_text,
    split_turns,
)
from art_rlvr.gepa import GEPAConfig, optimize_prompt
from art_rlvr.gepa.adapter import ARTPromptAdapter, example_eval
from art_rlvr.gepa.data import ExampleEval, RolloutTrace
from art_rlvr.gepa.reflection import reflective_records
from art_rlvr.gepa.store import EvalStore
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.journal import Journal
from art_rlvr.scenarios.scenario import load_scenario
from art_rlvr.testing import ScriptedServer, Step

KEY = "sk-gepa-episodes-0917"
SEED = "Answer the question."
BETTER = "You are a careful calculator. Reply with only the final number."


@pytest.fixture(scope="module")
def retry_task():
    return load_scenario("arith_retry", seed=0)


@pytest.fixture(scope="module", autouse=True)
def scripted_key():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SCRIPTED_EPISODE_KEY", KEY)
        yield


def scripted_policy(server: ScriptedServer) -> art.Model:
    return art.Model(
        name="scripted-policy",
        project="t",
        inference_base_url=server.base_url,
        inference_api_key="k",
        inference_model_name="scripted",
    )


async def scripted_episode(example, replies: list[str]) -> art.Trajectory:
    """One `arith_retry` rollout in which the policy says `replies`, turn by turn."""
    with ScriptedServer([Step.reply(r) for r in replies]) as server:
        return await rollout(scripted_policy(server), example, system_prompt=SEED)


def test_single_turn_rows_keep_their_form() -> None:
    """A single reply is its bare text, budget or not (what GEPA has always shown)."""
    rollouts = (
        RolloutTrace(output="x" * 500, reward=0.0, feedback="wrong", episode=()),
        RolloutTrace(
            output="y" * 500,
            reward=0.0,
            feedback="wrong",
            episode=({"role": "assistant", "content": "y" * 500},),
        ),
    )
    ev = ExampleEval(scenario_id="s", prompt_hash="h", inputs="q", rollouts=rollouts)
    rows = reflective_records([ev], limit=4, max_chars=200)
    assert rows == reflective_records([ev], limit=4)
    assert [r["Generated Outputs"] for r in rows] == ["x" * 500, "y" * 500]


# ------------------------------------------------------------------ real arith_retry episodes


async def test_reflection_rows_show_every_turn_of_an_arith_retry_episode(retry_task) -> None:
    """Two wrong tries then the right one, through the real environment: the row shows each
    try and the environment's reply to it, and the reward's feedback; under a tight budget the
    first try goes (with a marker) and the failing second and the last stay."""
    example = retry_task.splits["train"][0]
    answer = int(example.x["answer"])
    trajectory = await scripted_episode(example, [str(answer + 1), str(answer + 2), str(answer)])
    ev = example_eval(art.TrajectoryGroup([trajectory]), SEED)
    (rollout_trace,) = ev.rollouts
    assert [m["role"] for m in rollout_trace.episode] == ["assistant", "user"] * 2 + ["assistant"]
    (row,) = reflective_records([ev], limit=4, max_chars=1500)
    shown = row["Generated Outputs"]
    assert shown.splitlines() == [
        f"[assistant] {answer + 1}",
        f"[environment] {answer + 1} is not right. Try again (2 tries left). Answer with just "
        "the number.",
        f"[assistant] {answer + 2}",
        f"[environment] {answer + 2} is not right. Try again (1 try left). Answer with just "
        "the number.",
        f"[assistant] {answer}",
    ]
    assert row["Feedback"] == "reward 0.25: solved on try 3 of 3"
    assert row["Inputs"] == example.messages(SEED)[-1]["content"]
    tight = episode_text(rollout_trace.episode, len(shown) - 10)
    assert tight.startswith("[… 1 turn omitted …]\n[assistant] ")
    assert tight.endswith(f"[assistant] {answer}") and f"{answer + 2} is not right" in tight


@pytest.fixture(scope="module")
async def model_evals(model, retry_task) -> list[ExampleEval]:
    """Real episodes of the embedded model through the environment (seeded)."""
    store = EvalStore(100, Journal(None))
    adapter = ARTPromptAdapter(
        model, store, sampling=SamplingConfig(max_tokens=12), group_size=2, seed=5
    )
    return await adapter.aevaluate(retry_task.splits["train"][:3], SEED)


@pytest.mark.parametrize("budget", [200, 400, 1500])
def test_embedded_model_episodes_trimmed_to_budget(model_evals, budget) -> None:
    """Every row fits the budget and ends with its episode's last turn."""
    multi = [r for ev in model_evals for r in ev.rollouts if len(r.episode) > 1]
    assert multi, "the seed prompt should fail a first try somewhere"
    rows = reflective_records(model_evals, limit=8, max_chars=budget)
    assert rows and all(len(r["Generated Outputs"]) <= budget for r in rows)
    for r in multi:
        text = episode_text(r.episode, budget)
        turn = split_turns(r.episode)[-1]
        last = "\n".join(message_text(m, environment=k > 0) for k, m in enumerate(turn))
        assert len(text) <= budget and text.startswith(("[assistant]", "[… "))
        assert text.endswith(last) or "characters cut" in text


@pytest.mark.slow  # a whole loop on the embedded model; `uv run pytest -m slow`
async def test_gepa_on_arith_retry_reflects_on_whole_episodes(model, retry_task) -> None:
    """A whole GEPA iteration on `arith_retry` (embedded model, scripted reflector over
    loopback): the reflector is shown labelled multi-turn episodes with the environment's
    replies and the reward's feedback; its proposal is judged on the same minibatch."""
    reply = Step.reply(f"Improved:\n```\n{BETTER}\n```")
    with ScriptedServer([reply]) as server:
        cfg = GEPAConfig(
            reflection={
                "model": "openai/scripted",
                "api_base": server.base_url,
                "api_key_env": "SCRIPTED_EPISODE_KEY",
                "timeout_s": 5.0,
            },
            max_metric_calls=20,
            pareto_size=2,
            traces_per_iteration=3,
            group_size=1,
            temperature=0.0,
            max_tokens=12,
            max_iterations=1,
            max_episode_chars=400,
            report_val_limit=0,
        )
        result = await optimize_prompt(model, retry_task, seed_prompt=SEED, config=cfg)
        prompts = [r.last_user_text for r in server.chat_requests]
    assert len(prompts) == 1
    shown = prompts[0]
    assert "[assistant]" in shown and "[environment]" in shown and "is not right" in shown
    assert re.search(r"reward 0\.\d\d: not solved in \d tries of 3", shown)
    (event,) = result.history
    assert event.prompt == BETTER and event.score_after is not None
    assert event.accepted == (event.score_after > event.score_before)
