"""Expert iteration: hints from a scripted teacher over real HTTP (litellm), the leak check,
exact relabelling to the clean prompt, and a real round on the embedded model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import art
import pytest

from art_rlvr.backend import train as T
from art_rlvr.config import ConfigError, parse_args
from art_rlvr.ei.config import EIConfig
from art_rlvr.ei.expert import hinted_group, sft_trajectories
from art_rlvr.ei.hints import (
    RETRY_LEAK,
    clean_hint,
    echoes_hint,
    hinted_prompt,
    make_teacher,
    obtain_hint,
)
from art_rlvr.ei.records import EIState, RoundBuffer
from art_rlvr.ei.relabel import clean_messages, example_from, relabel, relabel_for_rl
from art_rlvr.llm import LLMCounters, LLMError
from art_rlvr.loops.ei import run_ei
from art_rlvr.loops.files import RunFiles
from art_rlvr.loops.rl import RunContext
from art_rlvr.rollouts import SamplingConfig
from art_rlvr.testing import ScriptedServer, Step

KEY = "sk-ei-teacher-secret-0451"
HELPFUL = "Add the two numbers; reply with only the digits of the result."


@pytest.fixture(scope="module", autouse=True)
def teacher_key():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SCRIPTED_TEACHER_KEY", KEY)
        yield


def teacher_config(server: ScriptedServer, **overrides: Any) -> EIConfig:
    values: dict[str, Any] = {
        "enable_teacher_hints": True,
        "teacher_model": "openai/scripted-teacher",
        "teacher_api_base": server.base_url,
        "teacher_api_key_env": "SCRIPTED_TEACHER_KEY",
        "teacher_timeout_s": 2.0,
        "teacher_max_retries": 0,
        "teacher_backoff_s": 0.01,
        "teacher_backoff_max_s": 0.02,
        "max_hint_attempts": 3,
    }
    return EIConfig(**(values | overrides))


def teacher(cfg: EIConfig):
    client, _ = make_teacher(None, cfg, LLMCounters())
    return client


async def ask(cfg: EIConfig, answer: str = "17", attempt: str | None = "15"):
    return await obtain_hint(
        teacher(cfg),
        scenario_id="s1",
        problem="What is 9 + 8? Answer with just the number.",
        answer=answer,
        solution="9 + 8 = 17",
        attempt=attempt,
        config=cfg,
    )


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mode=ei", "expert_samples=3"], "did you mean 'expert_samples_per_x'"),
        (["mode=ei", "distill=dpo"], "bad value for 'distill'"),
        (["mode=ei", "expert_samples_per_x=0"], "bad value for 'expert_samples_per_x'"),
        (["mode=ei", "max_hint_attempts=0"], "bad value for 'max_hint_attempts'"),
        (["mode=ei", "sft_learning_rate=nan"], "sft_learning_rate"),
        (["mode=ei", "teacher_api_base=http://127.0.0.1:1"], "teacher_api_base needs"),
    ],
)
def test_bad_ei_keys_are_one_line_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_args(argv)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_run_keys_are_handed_down_to_ei() -> None:
    cfg = parse_args(["mode=ei", "seed=7", "max_tokens=12", "temperature=0.5", "rounds=3"])
    assert (cfg.ei.seed, cfg.ei.max_tokens, cfg.ei.temperature, cfg.ei.rounds) == (7, 12, 0.5, 3)
    assert "ei" in cfg.public_dump() and "gepa" not in cfg.public_dump()


# ------------------------------------------------------------------ hints over real HTTP


async def test_helpful_hint_is_accepted_and_the_teacher_sees_answer_solution_attempt() -> None:
    with ScriptedServer([Step.reply(f"Hint: {HELPFUL}")]) as server:
        outcome = await ask(teacher_config(server))
        sent = server.chat_requests[0]
    assert outcome.hint == HELPFUL and outcome.calls == 1 and outcome.record.dropped is None
    prompt = json.dumps(sent.body["messages"])
    assert "9 + 8" in prompt and "17" in prompt and "15" in prompt and "do NOT reveal" in prompt
    assert sent.headers.get("authorization") == f"Bearer {KEY}"


@pytest.mark.parametrize(
    ("answer", "leaky"),
    [
        ("17", "The answer is 17."),
        ("17", "It is seventeen, trust me."),
        ("17", "Write $\\boxed{17}$."),
        ("17", "Twice it is \\frac{34}{2}, no."),
        ("17", "Not -17 but close."),
        ("1234", "Think of 1,234."),
        ("1234", "Think of 1 234."),
        ("1234", "One thousand two hundred thirty-four."),
        ("1234", "It is 1\\,234."),
        ("3/4", "It is \\frac{3}{4}."),
        ("3/4", "It is 0.75."),
        ("-5", "minus five"),
    ],
)
async def test_leaking_hint_is_rejected_and_regenerated(answer: str, leaky: str) -> None:
    with ScriptedServer([Step.reply(leaky), Step.reply(HELPFUL)]) as server:
        outcome = await ask(teacher_config(server), answer=answer)
        requests = server.chat_requests
    assert outcome.hint == HELPFUL and outcome.leak_rejected == 1 and outcome.calls == 2
    assert [a.verdict for a in outcome.record.attempts] == ["leak", "accepted"]
    assert requests[1].body["messages"][-1]["content"] == RETRY_LEAK


async def test_hint_that_always_leaks_is_dropped_after_max_attempts() -> None:
    with ScriptedServer([], default=Step.reply("It's 17.")) as server:
        outcome = await ask(teacher_config(server, max_hint_attempts=2))
        calls = len(server.chat_requests)
    assert outcome.hint is None and outcome.record.dropped == "leak" and calls == 2
    assert outcome.leak_rejected == 2


@pytest.mark.parametrize("step", [Step.error(500), Step.timeout(3.0)])
async def test_teacher_error_or_timeout_is_counted_not_raised(step: Step) -> None:
    with ScriptedServer([step]) as server:
        cfg = teacher_config(server, teacher_timeout_s=0.5)
        client = teacher(cfg)
        outcome = await obtain_hint(
            client,
            scenario_id="s1",
            problem="What is 9 + 8?",
            answer="17",
            solution=None,
            attempt=None,
            config=cfg,
        )
    assert outcome.hint is None and outcome.record.dropped == "teacher_error"
    assert client.counters.snapshot()["error_total"] == 1


async def test_refused_key_stops_the_run() -> None:
    with ScriptedServer([Step.error(401)]) as server, pytest.raises(LLMError) as error:
        await ask(teacher_config(server))
    assert error.value.fatal


@pytest.mark.parametrize(
    ("reply", "limit", "hint", "truncated"),
    [
        ("Hint: carry the one.", 50, "carry the one.", False),
        ('"Look at the tens."', 50, "Look at the tens.", False),
        (
            "Count up from the larger number, one step at a time",
            30,
            "Count up from the larger",
            True,
        ),
        ("   ", 50, "", False),
    ],
)
def test_clean_hint(reply: str, limit: int, hint: str, truncated: bool) -> None:
    assert clean_hint(reply, limit) == (hint, truncated)


@pytest.mark.parametrize(
    ("completion", "echoes"),
    [
        ("15", False),
        ("8 + 7 = 15", False),
        ("Adding them gives 15.", False),
        ("Add the two of them: 15", False),  # three words in common: fine
        ("Add the two numbers first: 15", True),
        ("As the hint says, 15", True),
        ("reply with only the digits of it: 15", True),
    ],
)
def test_hinted_completions_that_quote_the_hint_are_recognised(
    completion: str, echoes: bool
) -> None:
    assert echoes_hint(completion, HELPFUL) is echoes


# ------------------------------------------------------------------ relabelling, real model


async def test_relabelled_examples_are_exactly_clean_and_carry_no_hint(
    backend, model, task
) -> None:
    """A real hinted rollout (its Choice holds the hinted prompt's token ids) relabelled: what
    SFT and RL would train on is the clean prompt and the completion, token for token."""
    scenario = task.splits["train"][0]
    system = "Reply with only the final number."
    hint = "Marker-Q7 consider the units digit first."
    clean = list(clean_messages(scenario, system))
    assert clean == scenario.messages(system)
    group = await hinted_group(
        model,
        scenario,
        hinted_prompt(clean, hint),
        2,
        SamplingConfig(max_tokens=8, temperature=1.0),
        seed=1,
    )
    hinted = group.trajectories[0]
    assert "prompt_token_ids" in (hinted.messages_and_choices[-1].model_extra or {})
    example = example_from(scenario, system, hinted, "hinted")
    sft = relabel(example)
    assert sft.messages_and_choices == [
        *clean,
        {"role": "assistant", "content": hinted.messages_and_choices[-1].message.content},
    ]
    tok = backend._bases[model.base_model].tokenizer
    (sample,) = T.sft_samples([sft], tok, assistant_turns="last")
    prompt_len = sample.loss_mask.index(True)
    assert sample.input_ids[:prompt_len] == T.render_prompt(tok, clean)
    from art_rlvr.ei.records import RLGroup

    rl = relabel_for_rl(
        RLGroup(
            scenario_id=scenario.id,
            messages=example.messages,
            completions=(example.completion, "wrong"),
            rewards=(1.0, 0.0),
            relabelled=(True, False),
        )
    )
    samples, _ = T.samples_from_groups([rl], tok, scale_rewards=True)
    assert all(s.prompt_ids == T.render_prompt(tok, clean) for s in samples)
    trained_text = tok.decode(sample.input_ids) + "".join(
        tok.decode(s.prompt_ids + s.completion_ids) for s in samples
    )
    assert "Marker-Q7" not in trained_text and "Hint" not in trained_text


# ------------------------------------------------------------------ a real round


def tiny_run(tmp: Path, server: ScriptedServer, **extra: str) -> list[str]:
    args = {
        "mode": "ei",
        "run_dir": str(tmp),
        "max_tokens": "10",
        "val_limit": "1",
        "eval_test": "false",
        "rounds": "1",
        "scenarios_per_round": "5",
        "expert_samples_per_x": "1",
        "hinted_samples_per_x": "3",
        "sft_epochs": "1",
        "enable_teacher_hints": "true",
        "teacher_model": "openai/scripted-teacher",
        "teacher_api_base": server.base_url,
        "teacher_api_key_env": "SCRIPTED_TEACHER_KEY",
        "teacher_timeout_s": "0.5",
        "teacher_max_retries": "0",
        "teacher_concurrency": "1",
    } | extra
    return [f"{k}={v}" for k, v in args.items()]


WIDER = {"scenarios_per_round": "8", "hinted_samples_per_x": "6"}


async def test_round_with_scripted_teacher_recovers_and_resumes(
    tmp_path: Path, backend, make_model, task
) -> None:
    model = await make_model("ei")
    steps = [Step.error(500), Step.timeout(2.0)]
    with ScriptedServer(steps, default=Step.reply(HELPFUL)) as server:
        # enough hinted attempts (>= 6 problems x 6) that recovery does not hinge on one draw
        cfg = parse_args(tiny_run(tmp_path, server, **WIDER))
        ctx = RunContext(cfg, task, backend, model, RunFiles(tmp_path), time.monotonic())
        summary = await run_ei(ctx, cfg.ei)
        teacher_calls = len(server.chat_requests)
    rounds = [m for m in ctx.files.metrics() if m["event"] == "ei_round"]
    assert len(rounds) == 1
    stats = rounds[0]
    unsolved = stats["scenarios"] - stats["clean_solved"]
    assert unsolved >= 3, "the tiny setting should leave most scenarios unsolved"
    assert stats["hints_requested"] == unsolved == teacher_calls
    assert stats["teacher_errors"] == 2 and summary["teacher_errors"] == 2
    assert stats["hints_generated"] == unsolved - 2
    assert stats["hinted_attempts"] == 6 * stats["hints_generated"]
    assert stats["recovered"] >= 1 and stats["examples_from_hints"] >= 1
    assert isinstance(stats["hint_reliance_mean"], float) and summary["hint_reliance_mean"]
    assert stats["trained"] and summary["steps"] == 1

    buffer = RoundBuffer.model_validate_json((tmp_path / "ei" / "round_0000.json").read_text())
    by_id = {sc.id: sc for sc in task.splits["train"]}
    for example in buffer.examples:
        assert list(example.messages) == by_id[example.scenario_id].messages(None)
    trained = json.dumps([t.model_dump(mode="json") for t in sft_trajectories(buffer, cfg.ei)])
    assert HELPFUL not in trained and "Hint" not in trained
    assert all(h.hint == HELPFUL for h in buffer.hints if h.hint)
    hinted_rows = (tmp_path / "trajectories" / "hinted_0000.jsonl").read_text()
    assert HELPFUL in hinted_rows  # the hint is logged where it was used, and only there

    # killed after the buffer was saved, before training: resume trains on it, asks nobody
    state = EIState.model_validate_json((tmp_path / "state.json").read_text())
    step = await model.get_step()
    replay = state.model_copy(update={"rounds_done": 0, "pending": buffer, "pending_step": step})
    ctx.files.write_json("state.json", replay.model_dump(mode="json"))
    with ScriptedServer([], default=Step.error(500)) as silent:
        cfg2 = parse_args(tiny_run(tmp_path, silent, **WIDER))
        ctx2 = RunContext(cfg2, task, backend, model, RunFiles(tmp_path), time.monotonic())
        again = await run_ei(ctx2, cfg2.ei)
        assert silent.chat_requests == []
    assert again["steps"] == step + 1 and again["rounds"] == 1
    assert [m["round"] for m in ctx.files.metrics() if m["event"] == "ei_round"] == [0, 0]
    assert not (tmp_path / "trajectories" / "train_0001.jsonl").exists()

    # killed after training, before the bookkeeping: resume only records the round
    replay = replay.model_copy(update={"pending_step": step})
    ctx.files.write_json("state.json", replay.model_dump(mode="json"))
    with ScriptedServer([], default=Step.error(500)) as silent:
        ctx3 = RunContext(cfg2, task, backend, model, RunFiles(tmp_path), time.monotonic())
        third = await run_ei(ctx3, cfg2.ei.model_copy(update={"teacher_api_base": silent.base_url}))
    assert third["steps"] == step + 1
    final = EIState.model_validate_json((tmp_path / "state.json").read_text())
    assert final.pending is None and final.rounds_done == 1


async def test_other_settings_in_the_same_folder_are_refused(
    tmp_path: Path, backend, make_model, task
) -> None:
    model = await make_model("ei")
    (tmp_path / "state.json").write_text(EIState(fingerprint="0" * 16).model_dump_json())
    cfg = parse_args(["mode=ei", f"run_dir={tmp_path}", "rounds=0", "val_limit=1"])
    ctx = RunContext(cfg, task, backend, model, RunFiles(tmp_path), time.monotonic())
    with pytest.raises(ValueError, match="other settings"):
        await run_ei(ctx, cfg.ei)


def test_teacher_needs_the_answer_field(tmp_path: Path) -> None:
    cfg = EIConfig(enable_teacher_hints=True, answer_field="gold")
    from art_rlvr.loops.ei import check_records
    from art_rlvr.scenario import load_task

    ctx = RunContext(parse_args(["mode=ei"]), load_task("arith"), None, None, None, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="answer_field='gold' is not a field of arith"):
        check_records(ctx, cfg)


_ = art  # the fixtures hand out art models


@pytest.mark.slow
def test_cli_ei_survives_sigkill_and_resumes(tmp_path: Path) -> None:
    """`python -m art_rlvr.run mode=ei`, SIGKILLed after its first round, re-run: every round
    is recorded once, and the run ends where an uninterrupted one would (3 rounds trained)."""
    import os
    import signal
    import subprocess
    import sys

    run_dir = tmp_path / "ei"
    args = [
        sys.executable,
        "-m",
        "art_rlvr.run",
        "mode=ei",
        f"run_dir={run_dir}",
        "max_tokens=12",
        "val_limit=4",
        "eval_test=false",
        "rounds=3",
        "eval_every_rounds=3",
        "scenarios_per_round=4",
        "expert_samples_per_x=4",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and '"ei_round"' in metrics.read_text():
            break
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    again = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    rounds = [
        json.loads(line)["round"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"ei_round"' in line
    ]
    assert sorted(set(rounds)) == [0, 1, 2] and len(rounds) == len(set(rounds))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["steps"] == EIState.model_validate_json(
        (run_dir / "state.json").read_text()
    ).totals.get("rounds_trained")


async def test_rl_distillation_trains_on_contrast_groups_only(make_model, backend, task) -> None:
    from art_rlvr.ei.expert import distill_round
    from art_rlvr.ei.records import RLGroup, RoundStats

    model = await make_model("eirl")
    scenario = task.splits["train"][1]
    messages = clean_messages(scenario, None)
    answer = str(scenario.x["answer"])
    contrast = RLGroup(
        scenario_id=scenario.id,
        messages=messages,
        completions=(answer, "no idea", "0"),
        rewards=(1.0, 0.0, 0.0),
        relabelled=(True, False, False),
    )
    flat = contrast.model_copy(update={"rewards": (1.0, 1.0, 1.0)})
    buffer = RoundBuffer(
        round=0,
        scenario_ids=(scenario.id,),
        examples=(),
        rl_groups=(flat,),
        stats=RoundStats(round=0),
    )
    cfg = EIConfig(distill="rl")
    assert await distill_round(model, backend, buffer, cfg, learning_rate=1e-4) is None
    assert await model.get_step() == 0  # nothing to learn from: no step taken
    buffer = buffer.model_copy(update={"rl_groups": (flat, contrast)})
    metrics = await distill_round(model, backend, buffer, cfg, learning_rate=1e-4)
    assert metrics is not None and metrics["rl_groups"] == 1 and metrics["trajectories"] == 3
    assert await model.get_step() == 1


async def test_score_completions_sees_what_the_prompt_gives_away(backend, model) -> None:
    """Hint reliance rests on this: a completion the prompt spells out is likelier under it."""
    clean = [{"role": "user", "content": "What is 23 + 19? Answer with just the number."}]
    told = hinted_prompt(clean, "The result is 42; reply 42.")
    scores = await backend.score_completions(model, [clean, told, clean], ["42", "42", "42"])
    assert all(s < 0 for s in scores) and scores[0] == pytest.approx(scores[2], abs=1e-4)
    assert scores[1] > scores[0] + 0.1
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        await backend.score_completions(model, [clean, told], ["42"])
