"""Trajectories to training sequences: the data the policy-gradient and SFT losses read.

Data first: trajectory groups become `Sample`s (prompt ids, completion ids, which completion
tokens are trained, sampling logprobs, advantage), SFT trajectories become `SFTSample`s (ids and
a loss mask).

RL follows ART 0.5.23's `assemble_vllm_training_sequences` (art/preprocessing/tokenize.py):
every sampled `Choice` of every history (the main one and `additional_histories`) is trained
with its own sampling logprobs, on the exact prompt and completion ids the server returned.
Turns are joined into one sequence while each turn's prompt extends the tokens so far (an
append-only conversation); where it does not (a template that re-renders earlier turns, a
sampled tokenisation the template would not produce), a new sequence starts, so tokens that
were never sampled together are never spliced. Plain-dict messages, assistant ones included,
are context. Two deliberate differences from ART: a Choice without ids is re-rendered (ART
raises) and a Choice without logprobs is trained on-policy (ART skips it unless
`allow_training_without_logprobs`); both keep what this trainer did for single-turn data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import art
from art.trajectories import get_messages
from openai.types.chat.chat_completion import Choice

from art_rlvr.backend.chat import render_ids

LossFn = Literal["cispo", "ppo"]
AssistantTurns = Literal["all", "last"]


class TrainingDataError(ValueError):
    """The groups or trajectories handed to `train` cannot be trained on."""


@dataclass(frozen=True)
class Sample:
    """One training sequence: prompt, then completion tokens of which `trained` are in the
    loss (None: all of them; False marks context between assistant turns)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float] | None  # per completion token; NaN where unknown
    advantage: float
    trained: list[bool] | None = None

    @property
    def trained_count(self) -> int:
        return len(self.completion_ids) if self.trained is None else sum(self.trained)


@dataclass(frozen=True)
class Turn:
    """One sampled assistant turn: the ids it was sampled from and produced, its logprobs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None


@dataclass(frozen=True)
class SFTSample:
    input_ids: list[int]
    loss_mask: list[bool]  # True where the token is an assistant target


@dataclass(frozen=True)
class GroupStats:
    used: int
    skipped: int
    trajectories: int  # in all groups
    trained_trajectories: int = 0  # with at least one token in the loss
    turns: int = 0  # sampled assistant turns in the loss


def group_advantages(rewards: Sequence[float], *, scale: bool) -> list[float] | None:
    """Reward minus the group mean (optionally divided by the std); None if no signal."""
    if any(not math.isfinite(r) for r in rewards):
        raise TrainingDataError(f"non-finite reward in group: {list(rewards)}")
    if len(rewards) < 2:
        return None
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if max(abs(c) for c in centred) < 1e-9:
        return None
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + 1e-6) for c in centred]


def histories(trajectory: art.Trajectory) -> list[tuple[list[Any], Any]]:
    """(messages_and_choices, tools) of the main history, then of each additional one."""
    return [
        (list(trajectory.messages_and_choices), trajectory.tools),
        *((list(h.messages_and_choices), h.tools) for h in trajectory.additional_histories),
    ]


def render_prompt(tokenizer, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
    """Token ids of the chat prompt, ending with the assistant generation header."""
    return render_ids(tokenizer, messages, **template_kwargs)


def rendered_reply(tokenizer, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    """Ids of the last (assistant) message as the template renders it after its prompt,
    ending with the end-of-turn token (the template's trailing newline is not generated)."""
    prefix = render_ids(tokenizer, messages[:-1], tools)
    full = render_ids(tokenizer, messages, tools, add_generation_prompt=False)
    if full[: len(prefix)] != prefix:
        raise TrainingDataError(
            "the chat template does not render the assistant turn as a continuation of its "
            "prompt, so its tokens cannot be isolated"
        )
    reply = full[len(prefix) :]
    eos = tokenizer.eos_token_id
    while reply and reply[-1] != eos and tokenizer.decode([reply[-1]]).strip() == "":
        reply.pop()
    return reply


def choice_logprobs(choice: Choice, count: int) -> list[float] | None:
    """The sampling logprobs of a choice's completion ids; None if none were recorded."""
    content = choice.logprobs.content if choice.logprobs else None
    if not content:
        return None
    if len(content) != count:
        raise TrainingDataError(
            f"choice has {len(content)} logprobs for {count} completion token ids"
        )
    return [float(t.logprob) for t in content]


def choice_turn(choice: Choice, prompt: list[dict[str, Any]], tools: Any, tokenizer) -> Turn:
    """Exact ids and sampling logprobs when the server returned them; else re-render."""
    extra = choice.model_extra or {}
    if "prompt_token_ids" in extra and "token_ids" in extra:
        completion_ids = [int(t) for t in extra["token_ids"]]
        return Turn(
            [int(t) for t in extra["prompt_token_ids"]],
            completion_ids,
            choice_logprobs(choice, len(completion_ids)),
        )
    prompt_ids = render_ids(tokenizer, prompt, tools)
    if choice.message.tool_calls:
        (message,) = get_messages([choice])
        return Turn(prompt_ids, rendered_reply(tokenizer, [*prompt, message], tools), None)
    completion_ids = tokenizer(choice.message.content or "", add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        completion_ids = [*completion_ids, tokenizer.eos_token_id]
    return Turn(prompt_ids, completion_ids, None)


def history_turns(items: list[Any], tools: Any, tokenizer) -> Iterator[Turn]:
    """Every sampled assistant turn of one history, in order."""
    messages = get_messages(items)
    for index, item in enumerate(items):
        if isinstance(item, Choice):
            yield choice_turn(item, messages[:index], tools, tokenizer)


def sequence_sample(
    ids: list[int], trained: list[bool], logprobs: list[float], advantage: float
) -> Sample | None:
    """A token sequence with a trained flag and a logprob (NaN: unknown) per token, as a
    `Sample` whose prompt is everything before the first trained token; None if none is."""
    if True not in trained:
        return None
    first = trained.index(True)
    known = [lp for lp, t in zip(logprobs[first:], trained[first:], strict=True) if t]
    return Sample(
        prompt_ids=ids[:first],
        completion_ids=ids[first:],
        old_logprobs=None if all(math.isnan(lp) for lp in known) else logprobs[first:],
        advantage=advantage,
        trained=None if all(trained[first:]) else trained[first:],
    )


def assemble(turns: Iterable[Turn], advantage: float) -> list[Sample]:
    """Join turns into append-only sequences (ART's rule); a turn whose prompt does not extend
    the tokens so far starts a new sequence."""
    sequences: list[tuple[list[int], list[bool], list[float]]] = []
    for turn in turns:
        if not sequences or turn.prompt_ids[: len(sequences[-1][0])] != sequences[-1][0]:
            sequences.append(([], [], []))
        ids, trained, logprobs = sequences[-1]
        context = turn.prompt_ids[len(ids) :]
        ids.extend([*context, *turn.completion_ids])
        trained.extend([False] * len(context) + [True] * len(turn.completion_ids))
        logprobs.extend(
            [math.nan] * len(context) + (turn.logprobs or [math.nan] * len(turn.completion_ids))
        )
    found = (sequence_sample(*sequence, advantage) for sequence in sequences)
    return [sample for sample in found if sample is not None]


def trajectory_samples(
    trajectory: art.Trajectory, advantage: float, tokenizer
) -> tuple[list[Sample], int]:
    """The trajectory's training sequences and how many sampled turns they train."""
    if trajectory.exchanges:
        return exchange_samples(trajectory, advantage, tokenizer)
    turns = [
        turn
        for items, tools in histories(trajectory)
        for turn in history_turns(items, tools, tokenizer)
    ]
    if not turns:
        raise TrainingDataError(
            "trajectory has no sampled Choice in messages_and_choices: record the model's "
            "response choice (not a plain dict) so it can be trained on"
        )
    return assemble(turns, advantage), sum(1 for t in turns if t.completion_ids)


def exchange_samples(
    trajectory: art.Trajectory, advantage: float, tokenizer
) -> tuple[list[Sample], int]:
    """A trajectory recorded as `exchanges` (requests captured inside `with trajectory:`) is
    tokenized by ART's own `tokenize_trajectory_groups`, which needs the server's exact ids."""
    from art.preprocessing.tokenize import tokenize_trajectory_groups

    try:
        results = list(
            tokenize_trajectory_groups(
                tokenizer,
                [art.TrajectoryGroup([trajectory])],
                allow_training_without_logprobs=True,
                scale_rewards=False,
                shuffle_group_trajectories=False,
                drop_zero_advantage_trajectories=False,
            )
        )
    except (RuntimeError, ValueError) as error:
        raise TrainingDataError(f"ART cannot tokenize its exchanges: {error}") from error
    found = (
        sequence_sample(
            r.token_ids, [bool(m) for m in r.assistant_mask], list(r.logprobs), advantage
        )
        for r in results
    )
    samples = [sample for sample in found if sample is not None]
    if not samples:
        raise TrainingDataError("its exchanges hold no sampled token to train")
    return samples, sum(len(r.choice_offsets) for r in results)


def samples_from_groups(
    groups: Iterable[art.TrajectoryGroup], tokenizer, *, scale_rewards: bool
) -> tuple[list[Sample], GroupStats]:
    samples: list[Sample] = []
    used = skipped = count = trained = turns = 0
    for g, group in enumerate(groups):
        trajectories = list(group.trajectories)
        count += len(trajectories)
        advantages = group_advantages([t.reward for t in trajectories], scale=scale_rewards)
        if advantages is None:
            skipped += 1
            continue
        used += 1
        for t, (trajectory, advantage) in enumerate(zip(trajectories, advantages, strict=True)):
            try:
                found, turn_count = trajectory_samples(trajectory, advantage, tokenizer)
            except TrainingDataError as error:
                raise TrainingDataError(f"group {g}, trajectory {t}: {error}") from error
            samples.extend(found)
            trained += bool(found)
            turns += turn_count
    stats = GroupStats(used, skipped, count, trained_trajectories=trained, turns=turns)
    return samples, stats


def sft_samples(
    trajectories: Iterable[art.Trajectory], tokenizer, *, assistant_turns: AssistantTurns
) -> list[SFTSample]:
    """Render each history (the main one and `additional_histories`, with their tools); only
    assistant tokens carry loss: every assistant message, or only the final one (which, as in
    ART's `TrainSFTConfig(assistant_turns="last")`, must end the conversation)."""
    out: list[SFTSample] = []
    for n, trajectory in enumerate(trajectories):
        if trajectory.exchanges:
            raise TrainingDataError(
                f"SFT trajectory {n} records `exchanges`; SFT reads `messages_and_choices` "
                "(as ART's tokenize_sft_batch does)"
            )
        try:
            for items, tools in histories(trajectory):
                out.extend(
                    history_sft_samples(get_messages(items), tools, tokenizer, assistant_turns)
                )
        except TrainingDataError as error:
            raise TrainingDataError(f"SFT trajectory {n}: {error}") from error
    return out


def history_sft_samples(
    messages: list[dict[str, Any]], tools: Any, tokenizer, assistant_turns: AssistantTurns
) -> list[SFTSample]:
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistant_at:
        raise TrainingDataError("no assistant message to learn")
    if assistant_turns == "last" and assistant_at[-1] != len(messages) - 1:
        raise TrainingDataError(
            "assistant_turns='last' needs the final message to be the assistant's"
        )
    targets = assistant_at[-1:] if assistant_turns == "last" else assistant_at
    samples: list[SFTSample] = []
    ids: list[int] = []
    mask: list[bool] = []
    for i in targets:
        prefix = render_ids(tokenizer, messages[:i], tools)
        if prefix[: len(ids)] != ids:  # earlier turns re-rendered differently: a new sequence
            samples.append(SFTSample(ids, mask))
            ids, mask = [], []
        context = prefix[len(ids) :]
        reply = rendered_reply(tokenizer, messages[: i + 1], tools)
        ids = [*ids, *context, *reply]
        mask = [*mask, *[False] * len(context), *[True] * len(reply)]
    return [*samples, SFTSample(ids, mask)]
