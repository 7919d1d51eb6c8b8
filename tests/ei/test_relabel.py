"""Relabelling whole episodes (`ei.relabel`) in EI rounds on multi-turn `arith_retry`: the hint goes into the opening only,
the teacher sees the whole failed episode, a relabelled episode keeps every turn and loses the
hint, a hint quoted in a later turn is caught, and SFT trains every assistant turn.

The student is a scripted policy on loopback (a deterministic episode through the real
environment) or the real embedded model; the teacher is a scripted server called through
litellm. Nothing under test is patched."""

from __future__ import annotations

import itertools
from typing import Any

import art
import pytest

from art_rlvr.backend.training import train as T
from art_rlvr.core.outcome import turns
from art_rlvr.ei.config import EIConfig
from art_rlvr.ei.expert import collect_round
from art_rlvr.ei.hints import HINT_PREFIX, make_teacher
from art_rlvr.ei.relabel import clean_messages, hint_leaks, message_text, relabel
from art_rlvr.llm.client import LLMCounters
from art_rlvr.scenarios.scenario import batch_examples, load_scenario
from art_rlvr.testing import ScriptedServer, Step

KEY = "sk-ei-episodes-teacher-7731"
HINT = "Line up the ones column first, then carry into the tens column"


@pytest.fixture(scope="module")
def retry_task():
    return load_scenario("arith_retry", seed=0)


@pytest.fixture(scope="module", autouse=True)
def teacher_key():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SCRIPTED_EPISODE_TEACHER_KEY", KEY)
        yield


def ei_config(teacher: ScriptedServer, **overrides: Any) -> EIConfig:
    role = {
        "model": "openai/scripted-teacher",
        "api_base": teacher.base_url,
        "api_key_env": "SCRIPTED_EPISODE_TEACHER_KEY",
        "timeout_s": 5.0,
        "max_retries": 0,
    }
    values: dict[str, Any] = {
        "enable_teacher_hints": True,
        "teacher": role,
        "scenarios_per_round": 1,
        "group_size": 1,
        "hinted_samples_per_x": 1,
        "max_tokens": 16,
    }
    return EIConfig(**(values | overrides))


def student(server: ScriptedServer) -> art.Model:
    return art.Model(
        name="scripted-student",
        project="t",
        inference_base_url=server.base_url,
        inference_api_key="k",
        inference_model_name="scripted",
    )


def loss_spans(mask: list[bool]) -> int:
    return sum(1 for a, b in itertools.pairwise([False, *mask]) if b and not a)


def hinted_later(a: int) -> list[str]:
    return [str(a + 4), str(a + 5), str(a)]


def quoting_later(a: int) -> list[str]:
    return [str(a + 4), f"As the hint says, line up the ones column first. {a + 5}", str(a)]


@pytest.mark.parametrize(
    ("later", "kept"), [(hinted_later, True), (quoting_later, False)], ids=["clean", "quoted"]
)
async def test_scripted_round_hints_the_opening_and_relabels_every_turn(
    backend, model, retry_task, later, kept
) -> None:
    """One scenario: three wrong clean tries, a hint, then a hinted episode that solves it on
    its third try. Kept, it is distilled with all three tries under the clean prompt and no
    hint in any turn; when its second turn quotes the hint, it is caught and not distilled."""
    cfg0 = EIConfig(scenarios_per_round=1)
    (scenario,) = batch_examples(retry_task.splits["train"], 1, cfg0.seed, 0)
    answer = int(scenario.x["answer"])
    policy = [str(answer + k) for k in (1, 2, 3)] + later(answer)
    with (
        ScriptedServer([Step.reply(r) for r in policy]) as policy_server,
        ScriptedServer([Step.reply(HINT)]) as teacher_server,
    ):
        cfg = ei_config(teacher_server)
        client, _ = make_teacher(None, cfg, LLMCounters())
        output = await collect_round(
            student(policy_server), retry_task, cfg, 0, teacher=client, backend=None
        )
        asked = [r.messages for r in policy_server.chat_requests]
        taught = teacher_server.chat_requests[0].last_user_text
    clean = list(clean_messages(scenario, None))
    # the teacher saw the whole failed episode, the environment's replies included
    for k in (1, 2, 3):
        assert f"[assistant] {answer + k}" in taught
    assert f"[environment] {answer + 1} is not right" in taught
    # the hint went into the opening of every hinted request and nowhere else
    assert len(asked) == 6
    for request in asked[3:]:
        opening, rest = request[: len(clean)], request[len(clean) :]
        assert opening[-1]["content"] == f"{clean[-1]['content']}\n\n{HINT_PREFIX}{HINT}"
        assert opening[:-1] == clean[:-1]
        assert not any("ones column first, then" in str(m.get("content")) for m in rest)
    for request in asked[:3]:
        assert request[: len(clean)] == clean
    stats = output.buffer.stats
    assert (stats.hints_generated, stats.hinted_attempts, stats.hinted_solve_rate) == (1, 1, kept)
    assert stats.hinted_echo_rejected == (0 if kept else 1)
    examples = output.buffer.examples
    assert len(examples) == int(kept) and stats.examples_from_hints == int(kept)
    if not kept:
        return
    (example,) = examples
    sft = relabel(example)
    said = [m["content"] for m in turns(sft) if m["role"] == "assistant"]
    assert said == hinted_later(answer)  # every try kept, in order
    assert turns(sft)[: len(clean)] == clean and example.reward == 0.25
    assert not any("ones column" in message_text(m) for m in turns(sft))
    assert hint_leaks(sft, HINT, len(clean)) == []
    tok = backend._bases[model.base_model].tokenizer
    (sample,), _ = T.sft_samples([sft], tok, assistant_turns="all")
    assert loss_spans(sample.loss_mask) == 3  # SFT learns every assistant turn
    assert sample.input_ids[: sample.loss_mask.index(True)] == T.render_prompt(tok, clean)


@pytest.mark.slow  # a whole loop on the embedded model; `uv run pytest -m slow`
async def test_embedded_round_on_arith_retry_distils_no_hint_in_any_turn(
    backend, model, retry_task
) -> None:
    """A real round: the embedded model's episodes through the arith_retry environment, hints
    from a scripted teacher, every distilled episode relabelled. No turn of anything SFT would
    train on holds hint text; every distilled episode opens with the clean prompt; its
    assistant turns are all learnt."""
    with ScriptedServer([], default=Step.reply(HINT)) as teacher_server:
        cfg = ei_config(
            teacher_server,
            scenarios_per_round=3,
            group_size=2,
            hinted_samples_per_x=1,
            max_tokens=8,
        )
        client, _ = make_teacher(None, cfg, LLMCounters())
        output = await collect_round(model, retry_task, cfg, 0, teacher=client, backend=backend)
    buffer = output.buffer
    episodes = [t for g in output.clean_groups + output.hinted_groups for t in g.trajectories]
    assert any(t.metrics["turns"] > 1 for t in episodes)  # multi-turn episodes were sampled
    assert buffer.stats.hints_requested == len(buffer.hints) and buffer.stats.hints_generated
    by_id = {sc.id: sc for sc in retry_task.splits["train"]}
    tok = backend._bases[model.base_model].tokenizer
    for example in buffer.examples:
        sft = relabel(example)
        clean = list(clean_messages(by_id[example.scenario_id], None))
        assert turns(sft)[: len(clean)] == clean
        assert not any(HINT.lower() in message_text(m).lower() for m in turns(sft))
        assert hint_leaks(sft, HINT, len(clean)) == []
        (sample,), _ = T.sft_samples([sft], tok, assistant_turns="all")
        assert loss_spans(sample.loss_mask) == sum(m["role"] == "assistant" for m in turns(sft))
    # the hinted episodes themselves carry the hint only in their opening
    for group in output.hinted_groups:
        for t in group.trajectories:
            opening = len(clean_messages(by_id[t.metadata["scenario_id"]], None))
            later = turns(t)[opening:]
            assert HINT in turns(t)[opening - 1]["content"]
            assert not any(HINT in message_text(m) for m in later)
