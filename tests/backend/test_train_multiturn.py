"""Every sampled assistant turn is trained: ART-style multi-turn trajectories sampled from the
real TorchBackend server with the OpenAI SDK, checked against ART's own tokenizer."""

from __future__ import annotations

import asyncio
from typing import Any

import art
import pytest
from art.preprocessing.tokenize import tokenize_sft_batch, tokenize_trajectory_groups
from art.trajectories import LegacyHistory, get_messages
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message import ChatCompletionMessage

from art_rlvr import SamplingConfig, gather_groups
from art_rlvr.backend.chat.render import render_ids
from art_rlvr.backend.training import train as T

SYSTEM = {"role": "system", "content": "You are playing a guessing game. Answer briefly."}
MOVES = ["Guess a number from 1 to 9.", "Too low. Guess again.", "Too high. Last guess?"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def tokenizer_of(backend):
    return next(iter(backend._bases.values())).tokenizer


async def sample(
    model: art.TrainableModel, messages: list[Any], seed: int, max_tokens: int = 8, **kw: Any
) -> Choice:
    """One sampled turn through the OpenAI SDK, as ART's rollouts make it."""
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=messages,
        max_tokens=max_tokens,
        logprobs=True,
        seed=seed,
        **kw,
    )
    return response.choices[0]


async def game(model: art.TrainableModel, seed: int, moves: list[str] = MOVES) -> art.Trajectory:
    """ART's game examples: append the user's move and the sampled Choice to one trajectory
    and send `trajectory.messages()` back each turn."""
    trajectory = art.Trajectory(messages_and_choices=[SYSTEM], reward=float(seed % 3))
    for turn, move in enumerate(moves):
        trajectory.messages_and_choices.append({"role": "user", "content": move})
        choice = await sample(model, trajectory.messages(), seed * 10 + turn)
        trajectory.messages_and_choices.append(choice)
    return trajectory


def completion_tokens(trajectory: art.Trajectory) -> int:
    items = [
        *trajectory.messages_and_choices,
        *(i for h in trajectory.additional_histories for i in h.messages_and_choices),
    ]
    return sum(len(c.model_extra["token_ids"]) for c in items if isinstance(c, Choice))


@pytest.fixture(scope="module")
async def games(model) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(await asyncio.gather(*(game(model, seed) for seed in range(3))))


async def test_every_sampled_turn_is_trained_on_its_exact_tokens(backend, games) -> None:
    tok = tokenizer_of(backend)
    assert all("token_ids" in c.model_extra for t in games for c in t.messages_and_choices[2::2])
    samples, stats = T.samples_from_groups([games], tok, scale_rewards=True)
    trained = sum(s.trained_count for s in samples)
    assert trained == sum(completion_tokens(t) for t in games)  # ratio 1.0
    assert stats.turns == 3 * len(MOVES) and stats.trained_trajectories == 3
    spans = [span for s in samples for span in trained_spans(s)]  # in trajectory order
    assert spans == [
        c.model_extra["token_ids"] for t in games for c in t.messages_and_choices[2::2]
    ]
    before = sum(len(s.completion_ids) for s in last_choice_samples([games], tok))
    assert before < trained / 2  # the last-choice trainer left the earlier turns out


def trained_spans(sample: T.Sample) -> list[list[int]]:
    """The runs of trained completion tokens of a sample."""
    flags = sample.trained or [True] * len(sample.completion_ids)
    spans: list[list[int]] = []
    for token, flag, before in zip(sample.completion_ids, flags, [False, *flags[:-1]], strict=True):
        if flag and not before:
            spans.append([])
        if flag:
            spans[-1].append(token)
    return spans


def art_reference(tokenizer, groups: list[art.TrajectoryGroup]) -> list[tuple]:
    """ART 0.5.23's own tokenization of the same groups: (ids, trained positions, logprobs at
    them, advantage) per sequence, in trajectory order."""
    results = tokenize_trajectory_groups(
        tokenizer,
        groups,
        allow_training_without_logprobs=False,
        scale_rewards=True,
        shuffle_group_trajectories=False,
        drop_zero_advantage_trajectories=False,
    )
    return [
        (
            r.token_ids,
            [i for i, m in enumerate(r.assistant_mask) if m],
            [r.logprobs[i] for i, m in enumerate(r.assistant_mask) if m],
            r.advantage,
        )
        for r in results
    ]


def ours(samples: list[T.Sample]) -> list[tuple]:
    rows = []
    for s in samples:
        flags = s.trained or [True] * len(s.completion_ids)
        at = [len(s.prompt_ids) + i for i, f in enumerate(flags) if f]
        logprobs = [s.old_logprobs[i] for i, f in enumerate(flags) if f]
        rows.append((s.prompt_ids + s.completion_ids, at, logprobs, s.advantage))
    return rows


async def truncated_game(model) -> art.Trajectory:
    """The second request drops the first exchange: its prompt does not extend the first."""
    trajectory = art.Trajectory(messages_and_choices=[SYSTEM], reward=1.0)
    trajectory.messages_and_choices += [{"role": "user", "content": MOVES[0]}]
    trajectory.messages_and_choices.append(await sample(model, trajectory.messages(), 5))
    second = [SYSTEM, {"role": "user", "content": MOVES[1]}]
    trajectory.messages_and_choices += [second[1], await sample(model, second, 6)]
    return trajectory


async def game_with_side_history(model) -> art.Trajectory:
    side = [{"role": "user", "content": "Summarise the game in one word."}]
    history = LegacyHistory(messages_and_choices=[*side, await sample(model, side, 8)])
    trajectory = await game(model, 7, MOVES[:2])
    return trajectory.model_copy(update={"additional_histories": [history]})


async def scripted_game(model) -> art.Trajectory:
    """Sampled turns around a scripted (plain dict) assistant reply."""
    trajectory = art.Trajectory(
        messages_and_choices=[SYSTEM, {"role": "user", "content": MOVES[0]}]
    )
    trajectory.messages_and_choices.append(await sample(model, trajectory.messages(), 9))
    trajectory.messages_and_choices += [
        {"role": "user", "content": MOVES[1]},
        {"role": "assistant", "content": "Seven."},  # scripted, not sampled: context
        {"role": "user", "content": MOVES[2]},
    ]
    trajectory.messages_and_choices.append(await sample(model, trajectory.messages(), 10))
    return trajectory


async def test_agrees_with_art_tokenizer_on_multi_turn_histories(backend, model, games) -> None:
    """Same sequences, same trained positions, same logprobs and advantages as ART's
    `tokenize_trajectory_groups`, on: append-only games, a history whose second request
    dropped the first exchange (not append-only: ART and we split it), additional histories
    and scripted (plain dict) assistant messages."""
    tok = tokenizer_of(backend)
    truncated, with_side, mixed = await asyncio.gather(
        truncated_game(model), game_with_side_history(model), scripted_game(model)
    )
    groups = [games, art.TrajectoryGroup([truncated, with_side, mixed])]
    samples, _ = T.samples_from_groups(groups, tok, scale_rewards=True)
    reference = art_reference(tok, groups)
    assert len(samples) == len(reference) > 3 + 3  # the truncated history gave two sequences
    for mine, theirs in zip(ours(samples), reference, strict=True):
        assert mine[0] == theirs[0] and mine[1] == theirs[1]
        assert mine[2] == pytest.approx(theirs[2]) and mine[3] == pytest.approx(theirs[3])
    last = samples[-1]  # the mixed history: the scripted reply is context, never trained
    trained = [t for t, f in zip(last.completion_ids, last.trained or [], strict=False) if f]
    assert "Seven." in tok.decode(last.prompt_ids + last.completion_ids)
    assert "Seven" not in tok.decode(trained)


async def test_multi_turn_train_step_reports_turns_and_matches_served_logprobs(
    backend, make_model
) -> None:
    model = await make_model("multi")
    group = art.TrajectoryGroup(
        await asyncio.gather(*(game(model, seed, MOVES[:2]) for seed in (1, 2)))
    )
    result = await backend.train(model, [group], learning_rate=1e-4)
    m = result.metrics
    assert m["tokens"] == sum(completion_tokens(t) for t in group)
    assert m["assistant_turns"] == 4 and m["trajectories"] == 2
    assert abs(m["ratio_mean"] - 1) < 0.05  # every trained position lines up with its sample


async def test_tools_on_a_trajectory_reach_the_trained_prompt(backend, model) -> None:
    """Sampled with tools, the served prompt ids (which train) hold the schemas. ART's
    Trajectory stores tool dicts with their keys reordered ("function" before "type"); a turn
    re-rendered from `Trajectory.tools` as stored renders the tools exactly as served."""
    tok = tokenizer_of(backend)
    messages = [SYSTEM, {"role": "user", "content": "Weather in Oslo?"}]
    served = await sample(model, messages, 1, tools=TOOLS)
    unsampled = Choice(
        index=0,
        finish_reason="stop",
        message=ChatCompletionMessage(role="assistant", content="Cloudy."),
    )
    group = art.TrajectoryGroup(
        [
            art.Trajectory(messages_and_choices=[*messages, choice], tools=TOOLS, reward=reward)
            for choice, reward in ((served, 1.0), (unsampled, 0.0))
        ]
    )
    stored = group.trajectories[1].tools
    assert list(stored[0]) == ["function", "type"]  # ART's order, not the client's
    samples, stats = T.samples_from_groups(
        [group], tok, scale_rewards=False, policy=T.TurnPolicy(rerender=True)
    )
    assert samples[0].prompt_ids == served.model_extra["prompt_token_ids"]
    assert samples[1].prompt_ids == served.model_extra["prompt_token_ids"]
    assert render_ids(tok, messages, stored) == render_ids(tok, messages, TOOLS)
    assert (stats.counts.served, stats.counts.rerendered) == (1, 1)


@pytest.mark.parametrize("turns", ["all", "last"])
def test_sft_masks_over_tool_call_conversations(backend, turns) -> None:
    tok = tokenizer_of(backend)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup_weather", "arguments": '{"city": "Oslo"}'},
    }
    messages = [
        SYSTEM,
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "light rain, 4 C"},
        {"role": "assistant", "content": "Rainy, 4 degrees."},
    ]
    trajectory = art.Trajectory(messages_and_choices=messages, tools=TOOLS)
    (sample,), _ = T.sft_samples([trajectory], tok, assistant_turns=turns)
    target = tok.decode([i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m])
    context = tok.decode(
        [i for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if not m]
    )
    assert target.endswith("Rainy, 4 degrees.<|im_end|>")
    assert ('"city": "Oslo"' in target) == (turns == "all")
    assert "light rain" in context and "lookup_weather" in context and "Weather in Oslo" in context
    assert (
        sample.input_ids
        == render_ids(tok, messages, trajectory.tools, add_generation_prompt=False)[
            : len(sample.input_ids)
        ]
    )


@pytest.mark.parametrize("turns", ["all", "last"])
def test_sft_agrees_with_art_on_plain_conversations(backend, turns) -> None:
    """ART's `tokenize_sft_batch` trains the same tokens, plus the newline the ChatML template
    writes after `<|im_end|>` (never generated: the model stops at `<|im_end|>`)."""
    tok = tokenizer_of(backend)
    messages = [
        SYSTEM,
        {"role": "user", "content": MOVES[0]},
        {"role": "assistant", "content": "Five."},
        {"role": "user", "content": MOVES[1]},
        {"role": "assistant", "content": "Eight."},
    ]
    trajectory = art.Trajectory(messages_and_choices=messages)
    (mine,), _ = T.sft_samples([trajectory], tok, assistant_turns=turns)
    batch = tokenize_sft_batch(
        [trajectory],
        1e-4,
        tok,
        instruction_part="<|im_start|>user\n",
        response_part="<|im_start|>assistant\n",
        assistant_turns=turns,
    )
    ids = batch.trajectory_tensors[0]["input_ids"][0].tolist()
    labels = batch.trajectory_tensors[0]["labels"][0].tolist()
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    theirs = [i for i, label in enumerate(labels) if label != -100 and ids[i] not in newline]
    assert mine.input_ids == ids[: len(mine.input_ids)]
    assert [i for i, m in enumerate(mine.loss_mask) if m] == theirs


async def test_single_turn_samples_are_unchanged(backend, make_model, scenario) -> None:
    """Single-turn groups (sampled, and EI-style choices without ids) give exactly the
    samples of the earlier last-choice trainer."""
    tok = tokenizer_of(backend)
    model = await make_model("single")
    groups = await gather_groups(
        model, scenario.splits["train"][:2], 3, sampling=SamplingConfig(max_tokens=8), seed=3
    )
    relabelled = [
        art.Trajectory(
            messages_and_choices=[
                *scenario.splits["train"][0].messages(),
                Choice(
                    index=0,
                    finish_reason="stop",
                    message=ChatCompletionMessage(role="assistant", content=text),
                ),
            ],
            reward=reward,
        )
        for text, reward in (("42", 1.0), ("The answer is 7", 0.0))
    ]
    groups = [*groups, art.TrajectoryGroup(relabelled)]
    for g in groups[:-1]:
        for i, t in enumerate(g.trajectories):
            t.reward = float(i)
    samples, stats = T.samples_from_groups(
        groups, tok, scale_rewards=True, policy=T.TurnPolicy(rerender=True)
    )
    assert samples == last_choice_samples(groups, tok)
    assert stats.turns == len(samples) == 3 * 2 + 2


def last_choice_samples(groups, tokenizer) -> list[T.Sample]:
    """The trainer before multi-turn support, verbatim in effect: the last Choice of each
    trajectory, its server ids and logprobs, or the re-rendered prompt and re-tokenised text."""
    out = []
    for group in groups:
        advantages = T.group_advantages([t.reward for t in group.trajectories], scale=True)
        for trajectory, advantage in zip(group.trajectories, advantages, strict=True):
            items = trajectory.messages_and_choices
            index = max(i for i, item in enumerate(items) if isinstance(item, Choice))
            choice, prompt = items[index], [dict(m) for m in items[:index]]
            extra = choice.model_extra or {}
            if "token_ids" in extra:
                ids = (extra["prompt_token_ids"], extra["token_ids"])
                content = choice.logprobs.content if choice.logprobs else None
                logprobs = [t.logprob for t in content] if content else None
            else:
                rendered = tokenizer.apply_chat_template(
                    prompt, add_generation_prompt=True, tokenize=True
                )
                text = tokenizer(choice.message.content, add_special_tokens=False)["input_ids"]
                ids = (list(rendered["input_ids"]), [*text, tokenizer.eos_token_id])
                logprobs = None
            out.append(T.Sample(ids[0], ids[1], logprobs, advantage))
    return out


async def test_exchanges_recorded_by_art_train_every_turn(backend, model) -> None:
    """ART 0.5.23 records requests made inside `with trajectory:` as `exchanges`; they are
    tokenized by ART's own code, on the server's exact ids."""
    tok = tokenizer_of(backend)
    client = model.openai_client()
    trajectories, sampled = [], 0
    for seed in range(2):
        trajectory = art.Trajectory(reward=float(seed))
        with trajectory:
            messages: list[Any] = [{"role": "user", "content": MOVES[0]}]
            for turn in range(2):
                response = await client.chat.completions.create(
                    model=model.get_inference_name(),
                    messages=messages,
                    max_tokens=6,
                    logprobs=True,
                    seed=seed * 10 + turn,
                )
                sampled += response.usage.completion_tokens
                messages += [
                    response.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": MOVES[1]},
                ]
        assert trajectory.exchanges and not trajectory.messages_and_choices
        trajectories.append(trajectory)
    samples, stats = T.samples_from_groups(
        [art.TrajectoryGroup(trajectories)], tok, scale_rewards=True
    )
    assert sum(s.trained_count for s in samples) == sampled and stats.turns == 4
    with pytest.raises(T.TrainingDataError, match="exchanges"):
        T.sft_samples(trajectories, tok, assistant_turns="all")


def served_choice(logprobs: int) -> Choice:
    """A choice shaped as the server returns it: ids and `logprobs` entries."""
    entry = {"token": "a", "logprob": -0.1, "bytes": None, "top_logprobs": []}
    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "ok"},
            "prompt_token_ids": [1, 2],
            "token_ids": [5, 6, 2],
            "logprobs": {"content": [entry] * logprobs},
        }
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([SYSTEM, served_choice(2)], "2 logprobs for 3 completion token ids"),
        ([SYSTEM, {"role": "assistant", "content": "hi"}], "no sampled Choice"),
    ],
    ids=["logprob-count", "no-choice"],
)
def test_untrainable_trajectories_are_named_errors(backend, bad, message) -> None:
    good = art.Trajectory(messages_and_choices=[SYSTEM, served_choice(3)], reward=0.0)
    group = art.TrajectoryGroup([good, art.Trajectory(messages_and_choices=bad, reward=1.0)])
    with pytest.raises(T.TrainingDataError, match=rf"group 0, trajectory 1: .*{message}"):
        T.samples_from_groups([group], tokenizer_of(backend), scale_rewards=False)


# ---------------------------------------------------- ids the client dropped: the server's record

FORCED = {"type": "function", "function": {"name": "lookup_weather"}}


async def dropped(model: art.TrainableModel, messages: list[Any], seed: int, **kw: Any):
    """A turn as a client that keeps no ids leaves it (LangChain, a rebuilt Choice), and the
    ids the server sent for it (asked for here only to know the truth)."""
    choice = await sample(model, messages, seed, extra_body={"return_token_ids": True}, **kw)
    extra = dict(choice.model_extra or {})
    truth = (extra.pop("prompt_token_ids"), extra.pop("token_ids"))
    bare = Choice.model_validate(choice.model_dump(include=set(Choice.model_fields)))
    return bare, truth


async def tool_conversation(model, seed: int) -> tuple[list[Any], list[tuple[list, list]]]:
    """Forced call, its result, then a free answer: ART's agent shape, ids dropped."""
    items: list[Any] = [SYSTEM, {"role": "user", "content": "Weather in Oslo?"}]
    call, truth1 = await dropped(
        model, get_messages(items), seed, tools=TOOLS, tool_choice=FORCED, max_tokens=40
    )
    (message,) = get_messages([call])
    result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "4 C"}
    items += [call, result]
    answer, truth2 = await dropped(model, get_messages(items), seed + 1, tools=TOOLS)
    return [*items, answer], [truth1, truth2]


async def test_turns_without_ids_train_on_the_ids_served(backend, model) -> None:
    """ART-style trajectories whose Choices lost their ids (tools, a main and an additional
    history): every turn trains on exactly the served prompt and completion ids, found in the
    server's record; SFT over the same tool conversations learns the served ids too."""
    tok = tokenizer_of(backend)
    trainee = backend._trainees[model.name]
    trajectories, truths = [], []
    for seed in (11, 21):
        main, main_truth = await tool_conversation(model, seed)
        side, side_truth = await tool_conversation(model, seed + 5)
        trajectories.append(
            art.Trajectory(
                messages_and_choices=main,
                tools=TOOLS,
                additional_histories=[LegacyHistory(messages_and_choices=side, tools=TOOLS)],
                reward=float(seed == 11),
            )
        )
        truths += main_truth + side_truth
    policy = T.TurnPolicy(served=trainee.served)
    samples, stats = T.samples_from_groups(
        [art.TrajectoryGroup(trajectories)], tok, scale_rewards=False, policy=policy
    )
    turns = [
        turn
        for t in trajectories
        for items, tools in T.histories(t)
        for _, turn in T.history_turns(items, tools, tok, policy)
    ]
    assert sorted((t.prompt_ids, t.completion_ids) for t in turns) == sorted(truths)
    assert (stats.counts.recovered, stats.counts.rerendered) == (len(truths), 0)
    assert sum(s.trained_count for s in samples) == sum(len(ids) for _, ids in truths)

    sft, counts = T.sft_samples(trajectories, tok, assistant_turns="all", served=trainee.served)
    learnt = [[i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m] for s in sft]
    assert counts.recovered == len(truths) and counts.rerendered == 0
    assert sorted(i for ids in learnt for i in ids) == sorted(i for _, ids in truths for i in ids)


async def test_an_unserved_turn_is_refused_or_rerendered_when_asked(backend, make_model) -> None:
    """A Choice the server never returned (or edited since) is named, not silently
    re-tokenised; opting in re-renders it, and a reply cut by max_tokens gains no
    end-of-turn token it never sampled."""
    model = await make_model("refuse")
    tok = tokenizer_of(backend)
    messages = [SYSTEM, {"role": "user", "content": MOVES[0]}]
    served, _ = await dropped(model, messages, 3, max_tokens=4)
    assert served.finish_reason == "length"
    edited = served.model_copy(
        update={"message": served.message.model_copy(update={"content": "Seven."})}
    )
    group = art.TrajectoryGroup(
        [
            art.Trajectory(messages_and_choices=[*messages, served], reward=1.0),
            art.Trajectory(messages_and_choices=[*messages, edited], reward=0.0),
        ]
    )
    policy = T.TurnPolicy(served=backend._trainees[model.name].served)
    with pytest.raises(T.UnmatchedTurnError, match=r"group 0, trajectory 1: .*message 2: .*"):
        T.samples_from_groups([group], tok, scale_rewards=False, policy=policy)
    with pytest.raises(T.UnmatchedTurnError, match="allow_rerendered_turns"):
        await backend.train(model, [group])
    rerender = T.TurnPolicy(served=None, rerender=True)
    (cut, _), _ = T.samples_from_groups([group], tok, scale_rewards=False, policy=rerender)
    assert cut.completion_ids[-1] != tok.eos_token_id  # cut by the budget: no end of turn
    result = await backend.train(model, [group], allow_rerendered_turns=True, learning_rate=1e-6)
    assert (result.metrics["turns_recovered"], result.metrics["turns_rerendered"]) == (1, 1)
