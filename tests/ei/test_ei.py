"""Expert iteration: hints from a scripted teacher over real HTTP (litellm), the leak check,
exact relabelling to the clean prompt, and a real round on the embedded model."""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import art
import pytest
from openai.types.chat.chat_completion import Choice

from art_rlvr.backend.training import train as T
from art_rlvr.config.run_config import ConfigError, parse_args
from art_rlvr.core.outcome import attach_outcome, feedback_of, is_correct, is_sampled, turns
from art_rlvr.core.types import Episode, Messages, Reply
from art_rlvr.ei.config import EIConfig
from art_rlvr.ei.data import (
    DistillExample,
    EIState,
    HintRecord,
    RLGroup,
    RoundBuffer,
    RoundStats,
)
from art_rlvr.ei.expert import RoundOutput, hinted_group, sft_trajectories
from art_rlvr.ei.files import write_round_records
from art_rlvr.ei.hints import (
    RETRY_LEAK,
    HintOutcome,
    clean_hint,
    echoes_hint,
    hinted_prompt,
    make_teacher,
    obtain_hint,
)
from art_rlvr.ei.relabel import (
    clean_messages,
    example_from,
    hint_leaks,
    relabel,
    relabel_episode,
    relabel_for_rl,
    rl_group,
)
from art_rlvr.ei.stages import Hinted, relabel_hinted
from art_rlvr.llm.client import LLMCounters, LLMError
from art_rlvr.loops.context import RunContext
from art_rlvr.loops.runner import run_ei
from art_rlvr.rollouts.loop import run_episode
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.files import RunFiles
from art_rlvr.testing import ScriptedServer, Step

KEY = "sk-ei-teacher-secret-0451"
HELPFUL = "Add the two numbers; reply with only the digits of the result."


@pytest.fixture(scope="module", autouse=True)
def teacher_key():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SCRIPTED_TEACHER_KEY", KEY)
        yield


def teacher_config(server: ScriptedServer, **overrides: Any) -> EIConfig:
    role: dict[str, Any] = {
        "model": "openai/scripted-teacher",
        "api_base": server.base_url,
        "api_key_env": "SCRIPTED_TEACHER_KEY",
        "timeout_s": 2.0,
        "max_retries": 0,
        "backoff_s": 0.01,
        "backoff_max_s": 0.02,
    }
    teacher_overrides = {k: v for k, v in overrides.items() if k in role}
    values: dict[str, Any] = {
        "enable_teacher_hints": True,
        "teacher": role | teacher_overrides,
        "max_hint_attempts": 3,
    }
    rest = {k: v for k, v in overrides.items() if k not in role}
    return EIConfig(**(values | rest))


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
        (["mode=ei", "scenarios_per_rnd=3"], "did you mean 'scenarios_per_round'"),
        (["mode=ei", "distill=dpo"], "bad value for 'distill'"),
        (["mode=ei", "group_size=0"], "bad value for 'group_size'"),
        (["mode=ei", "max_hint_attempts=0"], "bad value for 'max_hint_attempts'"),
        (["mode=ei", "sft_learning_rate=nan"], "sft_learning_rate"),
        (["mode=ei", "teacher.api_base=http://127.0.0.1:1"], "api_base needs model"),
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
        cfg = teacher_config(server, timeout_s=0.5)
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
    backend, model, scenario
) -> None:
    """A real hinted rollout (its Choice holds the hinted prompt's token ids) relabelled: what
    SFT and RL would train on is the clean prompt and the completion, token for token."""
    record = scenario.splits["train"][0]
    system = "Reply with only the final number."
    hint = "Marker-Q7 consider the units digit first."
    clean = list(clean_messages(record, system))
    assert clean == record.messages(system)
    group = await hinted_group(
        model,
        record,
        hinted_prompt(clean, hint),
        2,
        SamplingConfig(max_tokens=8, temperature=1.0),
        seed=1,
    )
    hinted = group.trajectories[0]
    assert "prompt_token_ids" in (hinted.messages_and_choices[-1].model_extra or {})
    example = example_from(record, system, hinted, "hinted")
    sft = relabel(example)
    assert sft.messages_and_choices == [
        *clean,
        {"role": "assistant", "content": hinted.messages_and_choices[-1].message.content},
    ]
    tok = backend._bases[model.base_model].tokenizer
    (sample,), _ = T.sft_samples([sft], tok, assistant_turns="last")
    prompt_len = sample.loss_mask.index(True)
    assert sample.input_ids[:prompt_len] == T.render_prompt(tok, clean)
    from art_rlvr.ei.data import RLGroup

    rl = relabel_for_rl(
        RLGroup(
            scenario_id=record.id,
            messages=example.messages,
            completions=(example.completion, "wrong"),
            rewards=(1.0, 0.0),
            relabelled=(True, False),
        )
    )
    samples, _ = T.samples_from_groups(
        [rl], tok, scale_rewards=True, policy=T.TurnPolicy(rerender=True)
    )
    assert all(s.prompt_ids == T.render_prompt(tok, clean) for s in samples)
    trained_text = tok.decode(sample.input_ids) + "".join(
        tok.decode(s.prompt_ids + s.completion_ids) for s in samples
    )
    assert "Marker-Q7" not in trained_text and "Hint" not in trained_text


# ------------------------------------------------------------------ episodes: every turn


MARKER = "Marker-Z9 count the tens before the units"


def choice(text: str, **token_data: Any) -> Choice:
    """A sampled turn as the OpenAI SDK types it (what `chat.completions.create` returns)."""
    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "logprobs": None,
            "message": {"role": "assistant", "content": text},
            **token_data,
        }
    )


async def test_multi_turn_hinted_episode_relabels_clean_and_keeps_every_turn(
    backend, model, scenario
) -> None:
    """A real three-turn episode on the embedded model, hinted in its opening, relabelled:
    the clean opening, every later turn in order (the sampled `Choice`s with their text, the
    environment's messages as they were), no hint in any turn, and SFT and RL train all three
    assistant turns under the clean prompt, from the buffer's JSON."""
    record = scenario.splits["train"][2]
    system = "Reply with only the final number."
    clean = list(clean_messages(record, system))

    def env(messages: Messages) -> Reply:
        index = sum(m["role"] == "assistant" for m in messages) - 1
        if index == 2:
            return Reply(done=True)
        return Reply(messages=({"role": "user", "content": f"Check step {index} again."},))

    hinted = await run_episode(
        model,
        Episode(hinted_prompt(clean, MARKER), respond=env, max_turns=5),
        sampling=SamplingConfig(max_tokens=6, temperature=1.0, seed=3),
    )
    attach_outcome(hinted, reward=1.0, feedback="solved", metrics={})
    items = hinted.messages_and_choices
    assert [is_sampled(i) for i in items[len(clean) :]] == [True, False] * 2 + [True]
    assert all("prompt_token_ids" in (i.model_extra or {}) for i in items if is_sampled(i))
    assert hint_leaks(hinted, MARKER, len(clean)) == [len(clean) - 1]  # the hinted opening

    relabelled = relabel_episode(hinted, clean, MARKER)
    after = relabelled.messages_and_choices
    assert after[: len(clean)] == clean and len(after) == len(items)
    assert turns(relabelled)[len(clean) :] == turns(hinted)[len(clean) :]
    assert [is_sampled(i) for i in after] == [is_sampled(i) for i in items]
    assert not any((i.model_extra or {}) or i.logprobs for i in after if is_sampled(i))
    assert hint_leaks(relabelled, MARKER, len(clean)) == []
    assert "Marker-Z9" not in json.dumps(turns(relabelled))
    assert is_correct(relabelled) and feedback_of(relabelled) == "solved"

    tok = backend._bases[model.base_model].tokenizer
    example = DistillExample.model_validate_json(
        example_from(record, system, relabelled, "hinted").model_dump_json()
    )
    sft = relabel(example)
    assert turns(sft) == turns(relabelled)
    (sample,), _ = T.sft_samples([sft], tok, assistant_turns="all")
    spans = sum(1 for a, b in itertools.pairwise([False, *sample.loss_mask]) if b and not a)
    assert spans == 3  # every assistant turn is learnt, nothing else
    assert sample.input_ids[: sample.loss_mask.index(True)] == T.render_prompt(tok, clean)

    failed = relabelled.model_copy(update={"reward": 0.0})
    group = rl_group(record.id, clean, [(relabelled, True), (failed, False)])
    rl = relabel_for_rl(RLGroup.model_validate_json(group.model_dump_json()))
    samples, stats = T.samples_from_groups(
        [rl], tok, scale_rewards=True, policy=T.TurnPolicy(rerender=True)
    )
    assert stats.turns == 6 and all(s.old_logprobs is None for s in samples)
    prompt = T.render_prompt(tok, clean)
    assert all(s.prompt_ids[: len(prompt)] == prompt for s in samples)
    text = "".join(tok.decode(s.prompt_ids + s.completion_ids) for s in samples)
    assert "Marker-Z9" not in text + tok.decode(sample.input_ids) and "Hint" not in text


def episode(*later: dict[str, Any] | Choice, hint: str = MARKER) -> art.Trajectory:
    opening = hinted_prompt([{"role": "user", "content": "What is 38 + 47?"}], hint)
    trajectory = art.Trajectory(messages_and_choices=[*opening, *later])
    return attach_outcome(trajectory, reward=1.0, feedback="", metrics={})


TOOL_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    ],
}


@pytest.mark.parametrize(
    ("later", "leaking"),
    [
        ((choice("80"), {"role": "user", "content": "Again."}, choice("85")), []),
        ((choice("80"), {"role": "user", "content": "Again."}, choice("Count the tens: 85")), []),
        (
            (choice("80"), {"role": "user", "content": "Again."}, choice(f"{MARKER}: 85")),
            [3],
        ),
        ((choice("As the hint said"), {"role": "user", "content": "Go on."}, choice("85")), [1]),
        (
            (choice("80"), {"role": "user", "content": f"Recall: {MARKER.lower()}."}, choice("85")),
            [2],
        ),
        (
            (
                Choice.model_validate(
                    {"index": 0, "finish_reason": "tool_calls", "message": TOOL_CALL}
                ),
                {"role": "tool", "tool_call_id": "c1", "content": "count the tens before it"},
                choice("85"),
            ),
            [2],
        ),
    ],
)
def test_a_hint_in_any_later_turn_is_caught(
    later: tuple[dict[str, Any] | Choice, ...], leaking: list[int]
) -> None:
    clean = [{"role": "user", "content": "What is 38 + 47?"}]
    relabelled = relabel_episode(episode(*later), clean, MARKER)
    assert [is_sampled(i) for i in relabelled.messages_and_choices[1:]] == list(
        map(is_sampled, later)
    )
    assert hint_leaks(relabelled, MARKER, opening=1) == leaking


def test_relabel_refuses_an_episode_not_hinted_in_its_opening() -> None:
    clean = [{"role": "user", "content": "What is 38 + 47?"}]
    late = art.Trajectory(
        messages_and_choices=[*clean, choice("80"), {"role": "user", "content": MARKER}]
    )
    with pytest.raises(ValueError, match="does not open with the hinted prompt"):
        relabel_episode(late, clean, MARKER)


def test_a_correct_episode_leaking_the_hint_in_a_later_turn_is_not_distilled(scenario) -> None:
    """The round's stage: both hinted episodes are correct; the one whose third turn quotes
    the hint is counted (`hinted_echo_rejected`) and only the other is kept."""
    record = scenario.splits["train"][0]
    clean = list(clean_messages(record, None))
    opening = hinted_prompt(clean, MARKER)

    def scored(*later: dict[str, Any] | Choice) -> art.Trajectory:
        t = art.Trajectory(
            messages_and_choices=[*opening, *later], metadata={"scenario_id": record.id}
        )
        return attach_outcome(t, reward=1.0, feedback="", metrics={})

    leaky = scored(choice("1"), {"role": "user", "content": "No."}, choice(MARKER))
    fine = scored(choice("1"), {"role": "user", "content": "No."}, choice("2"))
    outcome = HintOutcome(record=HintRecord(scenario_id=record.id, hint=MARKER), calls=1)
    item = Hinted(record, art.TrajectoryGroup([]), outcome, art.TrajectoryGroup([leaky, fine]))
    verified = relabel_hinted([item], EIConfig(keep_per_x=2), None)
    assert verified.echoed == 1 and verified.correct == 2
    (recovered,) = verified.recovered
    assert [turns(t)[-1]["content"] for t in recovered.best] == ["2"]
    assert verified.records[0].hinted_correct == 2


def test_round_records_are_written_once_per_round(tmp_path: Path) -> None:
    """`write_round_records` (both loops' one call) replaces a round's hint lines when the
    round is redone after a kill; other rounds' lines stay, a torn line goes."""
    files = RunFiles(tmp_path)

    def output(r: int, *hints: str) -> RoundOutput:
        records = tuple(HintRecord(scenario_id=f"s{i}", hint=h) for i, h in enumerate(hints))
        buffer = RoundBuffer(
            round=r, scenario_ids=(), examples=(), hints=records, stats=RoundStats(round=r)
        )
        return RoundOutput(buffer, [], [])

    write_round_records(files, output(0, "a", "b"))
    with (tmp_path / "ei" / "hints.jsonl").open("a") as handle:
        handle.write('{"round": 1, "scenario_id": "s0", "hi')  # killed mid-line
    write_round_records(files, output(1, "c"), tag="_ei")
    write_round_records(files, output(1, "d"), tag="_ei")  # round 1 redone
    rows = [json.loads(line) for line in (tmp_path / "ei" / "hints.jsonl").read_text().splitlines()]
    assert [(r["round"], r["hint"]) for r in rows] == [(0, "a"), (0, "b"), (1, "d")]
    assert (tmp_path / "trajectories" / "train_0001_ei.jsonl").exists()
    assert RoundBuffer.model_validate_json((tmp_path / "ei" / "round_0001.json").read_text())


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
        "group_size": "1",
        "hinted_samples_per_x": "3",
        "sft_epochs": "1",
        "enable_teacher_hints": "true",
        "teacher.model": "openai/scripted-teacher",
        "teacher.api_base": server.base_url,
        "teacher.api_key_env": "SCRIPTED_TEACHER_KEY",
        "teacher.timeout_s": "0.5",
        "teacher.max_retries": "0",
        "teacher_concurrency": "1",
    } | extra
    return [f"{k}={v}" for k, v in args.items()]


WIDER = {"scenarios_per_round": "8", "hinted_samples_per_x": "6"}


async def test_round_with_scripted_teacher_recovers_and_resumes(
    tmp_path: Path, backend, make_model, scenario
) -> None:
    model = await make_model("ei")
    steps = [Step.error(500), Step.timeout(2.0)]
    with ScriptedServer(steps, default=Step.reply(HELPFUL)) as server:
        # enough hinted attempts (>= 6 problems x 6) that recovery does not hinge on one draw
        cfg = parse_args(tiny_run(tmp_path, server, **WIDER))
        ctx = RunContext(cfg, scenario, backend, model, RunFiles(tmp_path), time.monotonic())
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
    by_id = {sc.id: sc for sc in scenario.splits["train"]}
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
        ctx2 = RunContext(cfg2, scenario, backend, model, RunFiles(tmp_path), time.monotonic())
        again = await run_ei(ctx2, cfg2.ei)
        assert silent.chat_requests == []
    assert again["steps"] == step + 1 and again["rounds"] == 1
    # round 0 is one record however often a resume redoes its bookkeeping
    assert [m["round"] for m in ctx.files.metrics() if m["event"] == "ei_round"] == [0]
    assert not (tmp_path / "trajectories" / "train_0001.jsonl").exists()

    # killed after training, before the bookkeeping: resume only records the round
    replay = replay.model_copy(update={"pending_step": step})
    ctx.files.write_json("state.json", replay.model_dump(mode="json"))
    with ScriptedServer([], default=Step.error(500)) as silent:
        ctx3 = RunContext(cfg2, scenario, backend, model, RunFiles(tmp_path), time.monotonic())
        third = await run_ei(
            ctx3,
            cfg2.ei.model_copy(
                update={"teacher": cfg2.ei.teacher.model_copy(update={"api_base": silent.base_url})}
            ),
        )
    assert third["steps"] == step + 1
    final = EIState.model_validate_json((tmp_path / "state.json").read_text())
    assert final.pending is None and final.rounds_done == 1


async def test_other_settings_in_the_same_folder_are_refused(
    tmp_path: Path, backend, make_model, scenario
) -> None:
    model = await make_model("ei")
    (tmp_path / "state.json").write_text(EIState(fingerprint="0" * 16).model_dump_json())
    cfg = parse_args(["mode=ei", f"run_dir={tmp_path}", "rounds=0", "val_limit=1"])
    ctx = RunContext(cfg, scenario, backend, model, RunFiles(tmp_path), time.monotonic())
    with pytest.raises(ValueError, match="other settings"):
        await run_ei(ctx, cfg.ei)


def test_teacher_needs_the_answer_field(tmp_path: Path) -> None:
    cfg = EIConfig(enable_teacher_hints=True, answer_field="gold")
    from art_rlvr.loops.ei import check_records
    from art_rlvr.scenarios.scenario import load_scenario

    ctx = RunContext(parse_args(["mode=ei"]), load_scenario("arith"), None, None, None, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="answer_field='gold' is not a field of arith"):
        check_records(ctx, cfg)


@pytest.mark.parametrize(
    ("scenario", "choice", "message"),
    [
        (
            "calc",
            "divide",
            "tool_choice 'divide' is not auto, none, required or one of its tools (multiply)",
        ),
        ("arith", "multiply", "(it has none) (scenario arith)"),
    ],
)
def test_search_tool_choice_must_fit_the_scenario(scenario, choice, message) -> None:
    from art_rlvr.loops.ei import check_records
    from art_rlvr.scenarios.scenario import load_scenario

    cfg = EIConfig(search_tool_choice=choice)
    ctx = RunContext(parse_args(["mode=ei"]), load_scenario(scenario), None, None, None, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        check_records(ctx, cfg)
    assert str(caught.value).startswith("ei.search_tool_choice: tool_choice")


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
        "group_size=4",
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


async def test_rl_distillation_trains_on_contrast_groups_only(
    make_model, backend, scenario
) -> None:
    from art_rlvr.ei.data import RLGroup, RoundStats
    from art_rlvr.ei.expert import distill_round

    model = await make_model("eirl")
    record = scenario.splits["train"][1]
    messages = clean_messages(record, None)
    answer = str(record.x["answer"])
    contrast = RLGroup(
        scenario_id=record.id,
        messages=messages,
        completions=(answer, "no idea", "0"),
        rewards=(1.0, 0.0, 0.0),
        relabelled=(True, False, False),
    )
    flat = contrast.model_copy(update={"rewards": (1.0, 1.0, 1.0)})
    buffer = RoundBuffer(
        round=0,
        scenario_ids=(record.id,),
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
