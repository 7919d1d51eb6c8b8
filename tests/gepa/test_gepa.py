"""GEPA over ART rollouts of the real embedded model, reflecting through litellm against a
scripted server on loopback (and, once, against the embedded model itself)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import art
import pytest
from gepa.core.adapter import EvaluationBatch

from art_rlvr.core.outcome import attach_outcome
from art_rlvr.core.text import prompt_hash
from art_rlvr.core.types import Episode
from art_rlvr.gepa import (
    ARTPromptAdapter,
    BudgetExceeded,
    Candidate,
    EvalStore,
    ExampleEval,
    GEPAConfig,
    GEPAResult,
    GEPAState,
    Rejection,
    optimize_prompt,
)
from art_rlvr.gepa.adapter import example_eval
from art_rlvr.gepa.data import HistoryEvent, RejectionKind, RolloutTrace
from art_rlvr.gepa.pareto import eviction, frontier_indices, select_parent
from art_rlvr.gepa.reflection import (
    check_proposal,
    episode_text,
    extract_fenced,
    gold_answers_for_leak_check,
    leaked_answers,
    reflection_messages,
    reflective_records,
)
from art_rlvr.gepa.start import choose_seed_prompt, split_train
from art_rlvr.rollouts.loop import run_episode
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.journal import Journal
from art_rlvr.scenarios.scenario import batch_examples
from art_rlvr.testing import ScriptedServer, Step

KEY = "sk-gepa-secret-do-not-write-0815"
SEED = "Answer the question."
GOOD = "Reply with a bare number and nothing else."
GOOD2 = "Give only the numeric result, with no words."
SCRIPT = Path(__file__).parents[1] / "scripts" / "gepa_resume_run.py"


@pytest.fixture(scope="module", autouse=True)
def scripted_key():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SCRIPTED_GEPA_KEY", KEY)
        yield


def fenced(prompt: str, intro: str = "Here is the improved instruction:") -> Step:
    return Step.reply(f"{intro}\n```\n{prompt}\n```\nIt should help.")


def gepa_config(
    server: ScriptedServer, role: dict[str, Any] | None = None, **overrides: Any
) -> GEPAConfig:
    """A small GEPA run reflecting through the scripted server (`role`: reflection settings)."""
    reflection = {
        "model": "openai/scripted",
        "api_base": server.base_url,
        "api_key_env": "SCRIPTED_GEPA_KEY",
        "timeout_s": 5.0,
        "max_retries": 2,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
    }
    values: dict[str, Any] = {
        "reflection": reflection | (role or {}),
        "max_metric_calls": 60,
        "pareto_size": 3,
        "traces_per_iteration": 2,
        "group_size": 2,
        "max_tokens": 16,
        "report_val_limit": 0,
    }
    return GEPAConfig(**(values | overrides))


def minibatch_answers(scenario, cfg: GEPAConfig, iteration: int) -> list[str]:
    _, feedback = split_train(scenario.splits["train"], cfg.pareto_size, cfg.seed)
    batch = batch_examples(feedback, cfg.traces_per_iteration, cfg.seed, iteration)
    return gold_answers_for_leak_check(batch, cfg.answer_field)


def journal_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


def journaled_calls(run_dir: Path) -> int:
    return sum(len(r["eval"]["rollouts"]) for r in journal_rows(run_dir) if r["type"] == "eval")


# ------------------------------------------------------------------ pure parts


def test_fenced_prompt_must_be_complete() -> None:
    assert extract_fenced("x\n```\nReply with a number.\n```\ny") == "Reply with a number."
    assert extract_fenced("```text\nA\nB\n```") == "A\nB"
    assert extract_fenced("```one line```") == "one line"
    assert extract_fenced("first\n```\nold\n```\nthen\n```\nnew\n```") == "new"
    assert extract_fenced("Better:\n```\nReply with only the") is None  # cut off: no closing
    assert extract_fenced("no fence at all") is None


def test_leak_check_matches_whole_answers_only() -> None:
    assert leaked_answers("Always say 13.", ["13"]) == ["13"]
    assert leaked_answers("It is = 13", ["13", "7"]) == ["13"]
    assert leaked_answers("In 2013 we had 1.5 apples and 130 pears", ["13", "5"]) == []
    assert leaked_answers("no numbers", ["4"]) == []


def test_check_proposal_reasons() -> None:
    common = {"parents": ["Old."], "known": {"tried before.": "rejected: worse"}, "answers": ["42"]}
    verdict = check_proposal("```\nNew idea.\n```", "stop", max_chars=50, **common)
    ok, why = verdict.prompt, verdict.reason
    assert (ok, why) == ("New idea.", None)
    for reply, finish, reason in [
        ("```\nNew idea", "length", "cut off at the token limit"),
        ("```\n" + "x" * 60 + "\n```", "stop", "too long: 60 characters"),
        (
            "```\nThe answer is 42.\n```",
            "stop",
            "copies the expected answer of a shown example (42)",
        ),
        ("```\n  Old. \n```", "stop", "same as the instruction"),
        ("```\nTried   before.\n```", "stop", "repeats an earlier proposal (rejected: worse)"),
        ("```\n\n```", "stop", "empty"),
    ]:
        why = check_proposal(reply, finish, max_chars=50, **common).reason
        assert why is not None and reason in why, (reply, why)


REPLY_SHAPES = [
    # (reply, finish_reason, rejection kind or None for a usable proposal)
    ("```\nNew idea.\n```", "stop", None),
    ("Sure:\n```text\nNew idea.\n```\nDone.", "stop", None),
    ("no fence at all", "stop", RejectionKind.NO_FENCED_PROMPT),
    ("```\nNew idea", "length", RejectionKind.NO_FENCED_PROMPT),
    ("```\n\n```", "stop", RejectionKind.EMPTY),
    ("Here:\n```\n   \n```", "stop", RejectionKind.EMPTY),
    ("```\n" + "x" * 60 + "\n```", "stop", RejectionKind.TOO_LONG),
    ("```\nThe answer is 42.\n```", "stop", RejectionKind.LEAK),
    ("```\n  old. \n```", "stop", RejectionKind.UNCHANGED),
    ("```\nTried   before.\n```", "stop", RejectionKind.REPEAT),
    # the earlier rejection's reason says "too long": still a repeat
    ("```\nOverlong before.\n```", "stop", RejectionKind.REPEAT),
]


@pytest.mark.parametrize(("reply", "finish", "kind"), REPLY_SHAPES)
def test_proposal_check_returns_the_rejection_kind(
    reply: str, finish: str, kind: RejectionKind | None
) -> None:
    """The kind is decided by the check, not read back out of the reason's words: word matching
    counted an empty fenced instruction as `no_fenced_prompt`, and a repeat of a too-long
    proposal as `too_long`."""
    verdict = check_proposal(
        reply,
        finish,
        parents=["Old."],
        known={
            "tried before.": "rejected: worse",
            "overlong before.": "rejected: too long: 60 characters, the limit is 50",
        },
        answers=["42"],
        max_chars=50,
    )
    assert verdict.rejection == kind
    assert (verdict.reason is None) == (kind is None)


def test_summary_counts_rejections_by_their_recorded_kind() -> None:
    def refused(kind: RejectionKind | None, reason: str) -> HistoryEvent:
        return HistoryEvent(iteration=0, kind="reflection", reason=reason, rejection=kind)

    history = (
        refused(RejectionKind.EMPTY, "the fenced instruction was empty"),
        refused(RejectionKind.NO_FENCED_PROMPT, "no complete ``` fenced instruction"),
        refused(RejectionKind.EMPTY, "the fenced instruction was empty"),
        refused(None, "written before kinds were recorded"),
        HistoryEvent(iteration=1, kind="reflection_error", reason="timeout"),
    )
    result = GEPAResult(
        best_prompt=SEED,
        best_index=0,
        seed_prompt=SEED,
        frontier=(),
        candidates=(),
        history=history,
        iterations=2,
        stop_reason="",
        metric_calls_used=0,
        max_metric_calls=1,
        reflector="scripted",
        reflection={},
        counts={},
    )
    assert result.summary()["rejected"] == {"empty": 2, "no_fenced_prompt": 1, "other": 1}


@pytest.mark.parametrize(
    ("given", "gepa", "run", "expected"),
    [
        ("given", "gepa", "run", "given"),
        (None, "gepa", "run", "gepa"),
        (None, None, "run", "run"),
        (None, None, None, "task"),
        ("", "gepa", None, ""),  # an empty prompt is a choice, not a missing one
    ],
)
def test_seed_prompt_precedence(given, gepa, run, expected) -> None:
    assert choose_seed_prompt(given=given, gepa=gepa, run=run, scenario_default="task") == expected


async def test_reflection_sees_a_whole_multi_turn_episode() -> None:
    """A real tool-using episode (scripted policy on loopback): the evaluation is built from the
    trajectory contract, its inputs are the opening messages, and the reflection LM is shown
    every turn, tool call and tool result, with the reward's feedback."""

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first addend.
            b: The second addend.
        """
        return a + b

    script = [Step.calls(("add", {"a": 2, "b": 3}), text="Let me add."), Step.reply("It is 6.")]
    messages = [{"role": "system", "content": SEED}, {"role": "user", "content": "2 + 3?"}]
    with ScriptedServer(script) as server:
        policy = art.Model(
            name="episode",
            project="t",
            inference_base_url=server.base_url,
            inference_api_key="k",
            inference_model_name="scripted",
        )
        episode = await run_episode(
            policy, Episode(messages, tools=(add,)), metadata={"scenario_id": "sum"}
        )
    # what a rollout ends in (the trajectory contract), as a reward would score this episode
    trajectory = attach_outcome(episode, reward=0.0, feedback="the sum is 5", metrics={})
    ev = example_eval(art.TrajectoryGroup([trajectory]), SEED)
    (rollout,) = ev.rollouts
    assert (ev.scenario_id, ev.inputs, ev.prompt_hash) == ("sum", "2 + 3?", prompt_hash(SEED))
    assert (rollout.output, rollout.reward, rollout.feedback) == ("It is 6.", 0.0, "the sum is 5")
    assert [m["role"] for m in rollout.episode] == ["assistant", "tool", "assistant"]
    shown = reflective_records([ev], limit=4)[0]
    assert shown["Inputs"] == "2 + 3?" and shown["Feedback"] == "reward 0.00: the sum is 5"
    text = shown["Generated Outputs"]
    assert text == episode_text(rollout.episode)
    for part in ("[assistant] Let me add.", "[tool call] add(", "[tool result] 5", "It is 6."):
        assert part in text, text
    # a single reply is shown as its bare text, as before
    assert episode_text([{"role": "assistant", "content": "7"}]) == "7"


def test_reflective_records_put_failures_first_and_keep_contrast() -> None:
    def ev(sid: str, *rewards: float) -> ExampleEval:
        rollouts = tuple(
            RolloutTrace(output=f"{sid}-{r}-{k}", reward=r, feedback=f"fb {r}")
            for k, r in enumerate(rewards)
        )
        return ExampleEval(scenario_id=sid, prompt_hash="h", inputs=f"in {sid}", rollouts=rollouts)

    rows = reflective_records([ev("a", 1.0, 0.0), ev("b", 0.0, 0.0), ev("c", 1.0, 1.0)], limit=4)
    assert [r["Inputs"] for r in rows] == ["in a", "in b", "in b", "in a"]
    assert [r["Feedback"][:11] for r in rows] == ["reward 0.00"] * 3 + ["reward 1.00"]
    messages = reflection_messages(
        "Old prompt.", rows, [Rejection(iteration=0, prompt="Bad one.", reason="worse")], 99
    )
    text = messages[0]["content"]
    assert (
        "Old prompt." in text and "in b" in text and "> Bad one." in text and "at most 99" in text
    )


def test_pareto_selection_frontier_and_eviction() -> None:
    def cand(i: int, scores: list[float]) -> Candidate:
        return Candidate(
            index=i, prompt=f"p{i}", pareto_scores={f"s{k}": s for k, s in enumerate(scores)}
        )

    state = GEPAState(
        fingerprint="f",
        candidates=(cand(0, [0, 0, 1]), cand(1, [1, 0, 0]), cand(2, [1, 0, 1]), cand(3, [0, 1, 0])),
        pool=(0, 1, 2, 3),
    )
    assert frontier_indices(state) == [2, 3]  # 0 and 1 are dominated by 2
    picks = {select_parent(state, random.Random(k)) for k in range(30)}
    assert picks == {2, 3}
    assert eviction(state, pool_size=4) is None
    assert eviction(state, pool_size=3) == 0  # the weakest dominated, oldest first
    assert split_train(list(range(10)), 3, 0) == split_train(list(range(10)), 3, 0)


def test_config_rejects_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="api_base needs model"):
        GEPAConfig(reflection={"api_base": "http://127.0.0.1:1/v1"})
    with pytest.raises(ValueError, match="over max_prompt_chars"):
        GEPAConfig(seed_prompt="x" * 40, max_prompt_chars=20)


# ------------------------------------------------------------------ adapter


async def test_adapter_counts_every_rollout_and_refuses_over_budget(
    model, scenario, tmp_path
) -> None:
    examples = scenario.splits["train"][:3]
    store = EvalStore(5, Journal(tmp_path / "journal.jsonl"))
    adapter = ARTPromptAdapter(
        model,
        store,
        sampling=SamplingConfig(max_tokens=6),
        group_size=2,
        seed=3,
        loop=asyncio.get_running_loop(),
    )
    with pytest.raises(BudgetExceeded):
        await adapter.aevaluate(examples, SEED)  # 3 scenarios x 2 rollouts > 5
    assert store.spent == 0 and not (tmp_path / "journal.jsonl").exists()
    # gepa's synchronous protocol, from a worker thread, rollouts on this loop
    batch = await asyncio.to_thread(adapter.evaluate, examples[:2], {"system_prompt": SEED}, True)
    assert isinstance(batch, EvaluationBatch) and batch.num_metric_calls == 4 and store.spent == 4
    assert [t.scenario_id for t in batch.trajectories] == [s.id for s in examples[:2]]
    assert batch.scores == [t.score for t in batch.trajectories]
    again = await asyncio.to_thread(adapter.evaluate, examples[:2], {"system_prompt": SEED})
    assert again.scores == batch.scores and store.spent == 4  # seeded, so reused, not re-run
    dataset = adapter.make_reflective_dataset({"system_prompt": SEED}, batch, ["system_prompt"])
    assert set(dataset) == {"system_prompt"} and dataset["system_prompt"]
    assert EvalStore(5, Journal(tmp_path / "journal.jsonl")).spent == 4  # journaled
    with pytest.raises(RuntimeError, match="worker thread"):
        adapter.evaluate(examples[:1], {"system_prompt": SEED})


async def test_gepa_engine_drives_our_adapter_from_a_worker_thread(model, scenario) -> None:
    """gepa.optimize itself (synchronous, in a thread) with our adapter and litellm client."""
    import gepa

    from art_rlvr.llm.client import LLMClient, LLMRole

    train = scenario.splits["train"]
    store = EvalStore(10_000, Journal(None))
    adapter = ARTPromptAdapter(
        model,
        store,
        sampling=SamplingConfig(max_tokens=8),
        group_size=1,
        seed=1,
        loop=asyncio.get_running_loop(),
    )
    with ScriptedServer([], default=fenced(GOOD)) as server:
        client = LLMClient(
            LLMRole(
                model="openai/scripted", api_base=server.base_url, api_key_env="SCRIPTED_GEPA_KEY"
            )
        )
        result = await asyncio.to_thread(
            gepa.optimize,
            seed_candidate={"system_prompt": SEED},
            trainset=train[:2],
            valset=train[2:4],
            adapter=adapter,
            reflection_lm=client,
            reflection_minibatch_size=2,
            max_metric_calls=6,
            skip_perfect_score=False,
            seed=0,
        )
        assert server.chat_requests  # gepa reflected through our client
    assert result.candidates[0] == {"system_prompt": SEED}
    assert client.counters.snapshot()["succeeded"] >= 1
    assert (
        0 < store.spent <= result.total_metric_calls
    )  # our cache never costs more than gepa's count


# ------------------------------------------------------------------ scripted runs


class LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
async def gauntlet(model, scenario, tmp_path_factory):
    """One run through everything a reflection LM can do wrong (nothing is accepted:
    min_improvement_threshold=1 makes every evaluated proposal a rejection)."""
    run_dir = tmp_path_factory.mktemp("gauntlet") / "gepa"
    leak = minibatch_answers(scenario, GEPAConfig(pareto_size=3, traces_per_iteration=2), 0)[0]
    steps = [
        # iteration 0: cut-off reply, leaking reply, then two 500s before a usable reply
        Step.truncated("Here is a better instruction:\n```\nReply with only the"),
        fenced(f"Reply with a bare number, for example {leak}."),
        Step.error(500),
        Step.error(500),
        fenced(GOOD),
        # iteration 1: the reflector times out on every try
        Step.timeout(2.0),
        Step.timeout(2.0),
        Step.timeout(2.0),
        # iteration 2: the rejected proposal again, then a new one
        fenced(GOOD, intro="Try this:"),
        fenced(GOOD2),
    ]
    capture = LogCapture()
    logging.getLogger().addHandler(capture)
    old_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    try:
        with ScriptedServer(steps) as server:
            cfg = gepa_config(
                server,
                role={"timeout_s": 0.5},
                max_tokens=8,
                max_iterations=3,
                min_improvement_threshold=1.0,
                max_reflection_attempts=3,
            )
            result = await optimize_prompt(
                model, scenario, seed_prompt=SEED, config=cfg, run_dir=run_dir
            )
            requests = server.chat_requests
    finally:
        logging.getLogger().removeHandler(capture)
        logging.getLogger().setLevel(old_level)
    return result, requests, run_dir, capture.lines, leak


def events(result: GEPAResult, iteration: int) -> list:
    return [e for e in result.history if e.iteration == iteration]


def test_truncated_reply_is_refused_not_adopted(gauntlet) -> None:
    result, *_ = gauntlet
    first = events(result, 0)[0]
    assert first.attempt == 1 and first.prompt is None and not first.accepted
    assert first.finish_reason == "length" and "cut off at the token limit" in first.reason
    assert all(c.prompt != "Reply with only the" for c in result.candidates)


def test_leaking_proposal_is_refused_and_the_reflector_asked_again(gauntlet) -> None:
    result, requests, _, _, leak = gauntlet
    truncated, leaked, evaluated = events(result, 0)
    assert (
        leaked.attempt == 2
        and f"copies the expected answer of a shown example ({leak})" in leaked.reason
    )
    assert leaked.score_after is None and leaked.metric_calls == truncated.metric_calls  # not run
    assert f"for example {leak}." in requests[2].last_user_text  # shown back as rejected
    assert evaluated.prompt == GOOD and evaluated.score_after is not None


def test_server_errors_are_retried_into_a_proposal(gauntlet) -> None:
    result, requests, *_ = gauntlet
    assert [r.step for r in requests[2:5]] == [2, 3, 4]
    assert requests[2].last_user_text == requests[4].last_user_text  # the same question, retried
    assert result.reflection["errors"]["server_error"] == 2
    assert events(result, 0)[-1].prompt == GOOD


def test_timeout_is_counted_and_the_run_continues(gauntlet) -> None:
    result, *_ = gauntlet
    (error,) = events(result, 1)
    assert error.kind == "reflection_error" and "timeout" in error.reason
    assert result.reflection["errors"]["timeout"] == 3 and result.reflection["failed"] == 1
    assert result.counts["reflection_errors"] == 1
    assert (
        events(result, 2)
        and result.iterations == 3
        and result.stop_reason.startswith("max_iterations")
    )


def test_repeated_rejected_proposal_is_refused_and_the_first_shown(gauntlet) -> None:
    result, requests, run_dir, *_ = gauntlet
    repeat, fresh = events(result, 2)
    assert "repeats an earlier proposal" in repeat.reason and repeat.score_after is None
    shown = requests[8].last_user_text  # iteration 2's first ask
    assert "already tried and rejected" in shown and f"> {GOOD}" in shown
    assert "minibatch score" in shown  # with the reason it was rejected
    assert fresh.prompt == GOOD2 and fresh.score_after is not None
    good_evals = [
        r
        for r in journal_rows(run_dir)
        if r["type"] == "eval" and r["eval"]["prompt_hash"] == prompt_hash(GOOD)
    ]
    assert len(good_evals) == 2  # its one minibatch, evaluated once


def test_history_budget_and_secrets_on_disk(gauntlet) -> None:
    result, _, run_dir, log_lines, _ = gauntlet
    lines = [json.loads(x) for x in (run_dir / "prompt_history.jsonl").read_text().splitlines()]
    assert len(lines) == len(result.history) == 6  # 3 + 1 + 2 events in iterations 0, 1, 2
    assert {"parents", "score_before", "score_after", "accepted", "reason", "prompt"} <= set(
        lines[2]
    )
    assert json.loads((run_dir / "frontier.json").read_text())[0]["prompt"] == SEED
    assert result.metric_calls_used == journaled_calls(run_dir) <= result.max_metric_calls
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="ignore"), path
    assert log_lines and not any(KEY in line for line in log_lines)


async def test_empty_fenced_reply_is_counted_as_empty(model, scenario, tmp_path) -> None:
    """summary.json counts refusals by the kind the check decided: an empty fenced instruction
    was counted as `no_fenced_prompt` when kinds were guessed from the reason's words."""
    steps = [
        Step.reply("Here it is:\n```\n\n```"),
        Step.truncated("Better:\n```\nReply with only the"),
        fenced(GOOD),
    ]
    with ScriptedServer(steps) as server:
        cfg = gepa_config(server, max_iterations=1, max_tokens=8, min_improvement_threshold=1.0)
        result = await optimize_prompt(
            model, scenario, seed_prompt=SEED, config=cfg, run_dir=tmp_path
        )
    assert result.summary()["rejected"] == {"empty": 1, "no_fenced_prompt": 1, "no_improvement": 1}
    assert [e.rejection for e in result.history] == [
        RejectionKind.EMPTY,
        RejectionKind.NO_FENCED_PROMPT,
        RejectionKind.NO_IMPROVEMENT,
    ]
    on_disk = [json.loads(x) for x in (tmp_path / "prompt_history.jsonl").read_text().splitlines()]
    assert [row["rejection"] for row in on_disk] == ["empty", "no_fenced_prompt", "no_improvement"]


async def test_better_prompt_is_found_accepted_and_beats_the_seed_on_val(
    model, scenario, tmp_path
) -> None:
    """A genuinely better instruction (measured: greedy val@20 0.30 vs 0.15 for the seed) is
    accepted on the minibatch, leads the Pareto set, and is reported better on val."""
    with ScriptedServer([fenced(GOOD)]) as server:
        cfg = gepa_config(
            server,
            pareto_size=10,
            traces_per_iteration=3,
            group_size=1,
            temperature=0.0,
            max_iterations=1,
            report_val_limit=20,
        )
        result = await optimize_prompt(
            model, scenario, seed_prompt=SEED, config=cfg, run_dir=tmp_path
        )
    (win,) = result.history
    assert win.accepted and win.parents == (0,) and win.score_after > win.score_before
    assert result.best_prompt == GOOD and result.best_index == 1 and win.candidate == 1
    assert result.candidates[1].mean > result.candidates[0].mean
    assert result.best_val_accuracy > result.seed_val_accuracy
    assert result.val_n == 20 and result.report_rollouts == 40
    assert [c.prompt for c in result.frontier] == [GOOD]  # it dominates the seed
    history = [json.loads(x) for x in (tmp_path / "prompt_history.jsonl").read_text().splitlines()]
    assert history[0]["accepted"] and history[0]["parents"] == [0]
    assert json.loads((tmp_path / "frontier.json").read_text())[0]["prompt"] == GOOD


BUDGET_MATRIX = [
    # (max_metric_calls, pareto_size, traces_per_iteration, group_size, use_merge)
    (6, 3, 2, 2, False),
    (13, 3, 2, 2, False),
    (20, 3, 2, 2, False),
    (25, 2, 3, 1, True),
    (31, 1, 1, 3, True),
    (44, 2, 2, 2, True),
]


async def test_budget_is_never_exceeded(model, scenario, tmp_path) -> None:
    prompts = [f"Reply with only the final number. Variant {chr(65 + k)}." for k in range(20)]
    for n, (budget, pareto, m, k, merge) in enumerate(BUDGET_MATRIX):
        with ScriptedServer([fenced(p) for p in prompts]) as server:
            cfg = gepa_config(
                server,
                max_metric_calls=budget,
                pareto_size=pareto,
                traces_per_iteration=m,
                group_size=k,
                use_merge=merge,
                max_tokens=4,
                seed=n,
            )
            result = await optimize_prompt(
                model, scenario, seed_prompt=SEED, config=cfg, run_dir=tmp_path / str(n)
            )
        used = result.metric_calls_used
        print(
            f"budget {budget}: used {used} over {result.iterations} iterations, {len(result.accepted)} accepted"
        )
        assert used <= budget and used == journaled_calls(tmp_path / str(n))
        assert result.stop_reason.startswith("budget")
        assert (
            budget - used < 3 * m * k + pareto * k
        )  # it stopped only when an iteration might not fit


@pytest.mark.slow  # ~45 s; the measured run in the README covers it too
async def test_embedded_model_reflects_on_itself(model, scenario, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="art_rlvr")
    cfg = GEPAConfig(
        max_metric_calls=40,
        max_iterations=2,
        pareto_size=2,
        traces_per_iteration=2,
        group_size=2,
        max_tokens=8,
        reflection={"max_tokens": 64},
        report_val_limit=0,
    )
    result = await optimize_prompt(model, scenario, seed_prompt=SEED, config=cfg, run_dir=tmp_path)
    assert result.reflector == f"embedded:openai/{model.get_inference_name()}"
    assert "weak but real" in caplog.text
    assert result.reflection["calls"] >= 1 and result.metric_calls_used <= 40
    assert all(e.accepted or e.reason for e in result.history)
    assert len(result.candidates) == 1 + len(result.accepted)


# ------------------------------------------------------------------ kill and resume


def resume_config(server: ScriptedServer) -> GEPAConfig:
    return gepa_config(server, max_metric_calls=40, max_iterations=4, max_tokens=4)


RESUME_STEPS = [
    fenced(p) for p in (GOOD, GOOD2, "Write the result as digits only.", "Just the number.")
]


def comparable(result: GEPAResult) -> dict[str, Any]:
    data = result.model_dump(mode="json")
    data.pop("run_dir")
    data["reflection"].pop("slept_s")
    return data


@pytest.mark.slow  # ~70 s (two subprocesses and a reference run)
async def test_killed_run_resumes_to_the_uninterrupted_result(model, scenario, tmp_path) -> None:
    run_dir, out = tmp_path / "killed", tmp_path / "result.json"
    journal = run_dir / "gepa" / "journal.jsonl"
    with ScriptedServer(RESUME_STEPS, default=fenced(GOOD), replay_identical=True) as server:
        cfg = resume_config(server).model_dump_json()
        argv = [sys.executable, str(SCRIPT), str(run_dir), cfg, SEED, str(out)]
        env = {**os.environ, "SCRIPTED_GEPA_KEY": KEY}
        first = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and first.poll() is None:
            rows = journal_rows(run_dir / "gepa") if journal.exists() else []
            if any(r["type"] == "reflection" and r["key"].startswith("1:") for r in rows):
                break
            await asyncio.sleep(0.05)
        assert first.poll() is None, "the run ended before it could be killed"
        first.send_signal(signal.SIGKILL)
        first.wait()
        state = json.loads((run_dir / "gepa" / "state.json").read_text())
        assert state["iteration"] == 1 and not out.exists()  # killed inside iteration 1
        second = await asyncio.to_thread(
            subprocess.run, argv, env=env, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 0, second.stderr[-3000:]
    resumed = GEPAResult.model_validate_json(out.read_text())
    with ScriptedServer(RESUME_STEPS, default=fenced(GOOD), replay_identical=True) as server:
        reference = await optimize_prompt(
            model,
            scenario,
            seed_prompt=SEED,
            config=resume_config(server),
            run_dir=tmp_path / "reference",
        )
    assert comparable(resumed) == comparable(reference)
    assert resumed.metric_calls_used == journaled_calls(run_dir / "gepa") <= 40
    assert len([e for e in resumed.history if e.iteration == 0]) >= 1
