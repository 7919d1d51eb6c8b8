"""Rollouts and groups through ART's own gather, on the real backend."""

import art
import pytest
from openai.types.chat.chat_completion import Choice

from art_rlvr import SamplingConfig, gather_groups, rollout, rollout_group
from art_rlvr.core.outcome import feedback_of
from art_rlvr.core.text import prompt_hash
from art_rlvr.testing import ScriptedServer, Step


async def test_rollout_records_choice_reward_and_metadata(model, scenario) -> None:
    sc = scenario.splits["val"][0]
    t = await rollout(model, sc, sampling=SamplingConfig(max_tokens=16, temperature=0))
    assert isinstance(t, art.Trajectory)
    *messages, choice = t.messages_and_choices
    assert isinstance(choice, Choice) and choice.model_extra["token_ids"]
    assert messages == sc.messages()
    assert t.reward in (0.0, 1.0) and t.metrics["correct"] == t.reward
    assert t.metadata["scenario_id"] == sc.id
    assert t.metadata["prompt_hash"] == prompt_hash(scenario.default_system_prompt)
    assert t.metadata["feedback"]


async def test_custom_system_prompt_changes_hash(model, scenario) -> None:
    t = await rollout(
        model,
        scenario.splits["val"][1],
        system_prompt="Just digits.",
        sampling=SamplingConfig(max_tokens=8),
    )
    assert t.messages_and_choices[0] == {"role": "system", "content": "Just digits."}
    assert t.metadata["prompt_hash"] == prompt_hash("Just digits.")


async def test_group_and_gather_with_seeds(model, scenario, backend) -> None:
    examples = scenario.splits["train"][:3]
    sampling = SamplingConfig(max_tokens=16, temperature=1.0)
    groups = await gather_groups(model, examples, 4, sampling=sampling, seed=7)
    assert [len(g.trajectories) for g in groups] == [4, 4, 4]
    assert [g.metadata["scenario_id"] for g in groups] == [s.id for s in examples]
    again = await rollout_group(model, examples[0], 4, sampling=sampling, seed=7)
    choices = [[t.messages_and_choices[-1] for t in g.trajectories] for g in (groups[0], again)]
    if backend.device.type != "cpu":
        pytest.skip(
            "the engine is batch-invariant on CPU only: on CUDA a row's logits depend on what "
            "else is in the batch, so a group sampled alone and inside a gather can differ"
        )
    # batch-invariant engine: alone or beside 8 other rows, the same tokens and logprobs
    alone, amid = (
        [(c.model_extra["token_ids"], [lp.logprob for lp in c.logprobs.content]) for c in g]
        for g in (choices[1], choices[0])
    )
    assert alone == amid


async def test_trajectories_tokenize_with_art(model, scenario, backend) -> None:
    """ART's own `Trajectory.tokenize` accepts what our server returned, token for token."""
    t = await rollout(model, scenario.splits["val"][2], sampling=SamplingConfig(max_tokens=8))
    base = next(iter(backend._bases.values()))
    tokenized = t.tokenize(
        model=model.get_inference_name(), base_model=base.path, tokenizer=base.tokenizer
    )
    choice = t.messages_and_choices[-1]
    expected = choice.model_extra["prompt_token_ids"] + choice.model_extra["token_ids"]
    assert list(tokenized.tokens)[: len(expected)] == expected
    sampled = [lp.logprob for lp in choice.logprobs.content]
    assert list(tokenized.logprobs)[len(expected) - len(sampled) : len(expected)] == sampled


@pytest.mark.parametrize(("max_in_flight", "first_wave"), [(3, 3), (None, 9)])
async def test_max_in_flight_caps_open_requests(scenario, max_in_flight, first_wave) -> None:
    """Against a loopback server that takes 0.4 s a reply: with a cap of 3, nine rollouts
    arrive three at a time; without one, all at once."""
    with ScriptedServer([], default=Step.reply("4", delay_s=0.4)) as server:
        model = art.Model(
            name="capped", project="t", inference_base_url=server.base_url,
            inference_api_key="k", inference_model_name="scripted",
        )  # fmt: skip
        groups = await gather_groups(
            model, scenario.splits["train"][:3], 3, max_in_flight=max_in_flight
        )
        arrivals = sorted(r.at for r in server.chat_requests)
    assert sum(len(g.trajectories) for g in groups) == 9 and len(arrivals) == 9
    assert sum(t < arrivals[0] + 0.3 for t in arrivals) == first_wave
    if max_in_flight is not None:
        with pytest.raises(ValueError, match="max_in_flight"):
            await gather_groups(model, scenario.splits["train"][:1], 2, max_in_flight=0)


# ---- the single-turn request, exactly as before ----------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(max_tokens=16, temperature=0.0, seed=5),
        SamplingConfig(max_tokens=32, temperature=0.7, top_p=0.9, stop=("\n",)),
    ],
)
async def test_a_single_turn_rollout_sends_the_request_it_always_sent(scenario, sampling) -> None:
    """The old `rollout` made one call, inlined here as it was; the episode path must send the
    same body and keep the same trajectory."""
    sc = scenario.splits["val"][3]
    with ScriptedServer([], default=Step.reply("The answer is 9")) as server:
        model = art.Model(
            name="scripted", project="t", inference_base_url=server.base_url,
            inference_api_key="k", inference_model_name="scripted",
        )  # fmt: skip
        t = await rollout(model, sc, sampling=sampling, metadata={"hint": "none"})
        extra = {"seed": sampling.seed} if sampling.seed is not None else {}
        await model.openai_client().chat.completions.create(
            model=model.get_inference_name(None), messages=sc.messages(),
            max_tokens=sampling.max_tokens, temperature=sampling.temperature,
            top_p=sampling.top_p, stop=list(sampling.stop) or None, logprobs=True, **extra,
        )  # fmt: skip
        new, old = (r.body for r in server.chat_requests)
    assert new == old  # byte for byte, key for key
    assert "tools" not in new and "tool_choice" not in new
    score = await sc.score("The answer is 9")
    assert t.messages_and_choices[:-1] == sc.messages() and t.tools is None and t.logs == []
    assert isinstance(t.messages_and_choices[-1], Choice)
    assert t.reward == score.reward and feedback_of(t) == score.feedback
    assert t.metrics == {
        "completion_tokens": t.metrics["completion_tokens"],
        "truncated": 0.0,
        **score.metrics,
    }
    assert set(t.metadata) == {"scenario_id", "split", "task", "prompt_hash", "hint", "feedback"}
