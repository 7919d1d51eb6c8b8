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
are context.

Where the client dropped the ids (LangChain, the Agents SDK, a Choice rebuilt from text), they
are recovered from what TorchBackend's server recorded (`served.ServedLog`): what trains is what
was sampled. A turn the server has no record of is refused, as ART refuses a Choice without
vLLM's ids, unless the caller opts in to re-rendering it from its text (`TurnPolicy.rerender`;
expert iteration's relabelled turns need it); a re-rendered reply cut by `max_tokens` gets no
end-of-turn token. A Choice with ids but no logprobs is skipped unless
`allow_training_without_logprobs`, as in ART. Every turn is counted by where its ids came from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import art
from art.trajectories import get_messages
from art.types import MessagesAndChoices, Tools
from openai.types.chat.chat_completion import Choice

from art_rlvr.backend.chat.render import render_ids
from art_rlvr.backend.serving.served import ServedLog, ServedTurn

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


TurnSource = Literal["served", "recovered", "rerendered"]


@dataclass(frozen=True)
class Turn:
    """One sampled assistant turn: the ids it was sampled from and produced, its logprobs, and
    where the ids came from: the Choice itself, the server's record, or a re-rendering."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None
    source: TurnSource = "served"


@dataclass(frozen=True)
class TurnPolicy:
    """How turns whose ids the client dropped are trained: recovered from the server's record,
    else refused, unless `rerender` (then re-rendered from their text, and counted so)."""

    served: ServedLog | None = None
    rerender: bool = False
    without_logprobs: bool = False  # ART's allow_training_without_logprobs
    model: str | None = None  # the policy's inference name: which exchanges are its turns
    # served turns already handed out in this batch (the same reply sampled twice is two turns)
    claimed: set[tuple[str, int]] = field(default_factory=set, compare=False, repr=False)

    def fresh(self) -> TurnPolicy:
        """This policy for a new batch: nothing claimed yet."""
        return replace(self, claimed=set())

    def find(
        self, prompt: Sequence[object], tools: Sequence[object] | None, reply: object
    ) -> ServedTurn | None:
        if self.served is None:
            return None
        response_id = (reply.model_extra or {}).get("id") if isinstance(reply, Choice) else None
        message = reply.message if isinstance(reply, Choice) else reply
        return self.served.find(prompt, tools, message, response_id, self.claimed)


SOURCES = ("served", "recovered", "rerendered", "skipped")


@dataclass
class TurnCounts:
    """Trained turns by where their ids came from, and the turns skipped (no logprobs)."""

    served: int = 0
    recovered: int = 0
    rerendered: int = 0
    skipped: int = 0

    def add(self, turns: Iterable[Turn | None]) -> None:
        for turn in turns:
            if turn is None:
                self.skipped += 1
            elif turn.completion_ids:
                setattr(self, turn.source, getattr(self, turn.source) + 1)

    def merge(self, other: TurnCounts) -> None:
        for name in SOURCES:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def trained(self) -> int:
        return self.served + self.recovered + self.rerendered

    def metrics(self) -> dict[str, float]:
        return {f"turns_{name}": float(getattr(self, name)) for name in SOURCES}


class UnmatchedTurnError(TrainingDataError):
    """A sampled turn without ids that the server has no record of."""


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
    counts: TurnCounts = field(default_factory=TurnCounts)

    @property
    def turns(self) -> int:
        """Sampled assistant turns in the loss."""
        return self.counts.trained


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


def histories(trajectory: art.Trajectory) -> list[tuple[MessagesAndChoices, Tools | None]]:
    """(messages_and_choices, tools) of the main history, then of each additional one."""
    return [
        (list(trajectory.messages_and_choices), trajectory.tools),
        *((list(h.messages_and_choices), h.tools) for h in trajectory.additional_histories),
    ]


def render_prompt(
    tokenizer, messages: Sequence[dict[str, object]], **template_kwargs: Any
) -> list[int]:
    """Token ids of the chat prompt, ending with the assistant generation header."""
    return render_ids(tokenizer, messages, **template_kwargs)


def rendered_reply(
    tokenizer,
    messages: Sequence[dict[str, object]],
    tools: Sequence[dict[str, object]] | None = None,
) -> list[int]:
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


def choice_turn(
    choice: Choice, prompt: list[Any], tools: Any, tokenizer, policy: TurnPolicy
) -> Turn | None:
    """The turn's exact ids and sampling logprobs: from the Choice when the server returned
    them, else from the server's record; else re-rendered (if the policy opts in) or refused.
    None: skipped, ids without logprobs (ART's rule)."""
    extra = choice.model_extra or {}
    if "prompt_token_ids" in extra and "token_ids" in extra:
        completion_ids = [int(t) for t in extra["token_ids"]]
        logprobs = choice_logprobs(choice, len(completion_ids))
        if logprobs is None and (found := policy.find(prompt, tools, choice)) is not None:
            logprobs = (
                list(found.logprobs) if list(found.completion_ids) == completion_ids else None
            )
        if logprobs is None and not policy.without_logprobs:
            return None
        return Turn([int(t) for t in extra["prompt_token_ids"]], completion_ids, logprobs)
    if (found := policy.find(prompt, tools, choice)) is not None:
        prompt_ids, completion_ids, logprobs = found.as_lists()
        return Turn(prompt_ids, completion_ids, logprobs, "recovered")
    if policy.rerender:
        return rerendered_turn(choice, prompt, tools, tokenizer)
    raise UnmatchedTurnError(
        "the Choice carries no token ids (prompt_token_ids / token_ids) and this backend's "
        "server has no record of that reply to that conversation (sampled elsewhere or before "
        "the backend started, evicted, or edited since). Training it would mean re-tokenising "
        "its text, which is not what was sampled; pass allow_rerendered_turns=True to "
        "backend.train to do so anyway"
    )


def rerendered_turn(choice: Choice, prompt: list[Any], tools: Any, tokenizer) -> Turn:
    """The turn re-rendered from its text (or its own completion ids, where only the prompt's
    were dropped); a reply cut by the token budget ends where it was cut, with no end-of-turn
    token it never sampled."""
    prompt_ids = render_ids(tokenizer, prompt, tools)
    extra = choice.model_extra or {}
    if "token_ids" in extra:
        completion_ids = [int(t) for t in extra["token_ids"]]
    elif choice.message.tool_calls:
        (message,) = get_messages([choice])
        completion_ids = rendered_reply(tokenizer, [*prompt, dict(message)], tools)
    else:
        text = choice.message.content or ""
        completion_ids = [*tokenizer(text, add_special_tokens=False)["input_ids"]]
        if tokenizer.eos_token_id is not None:
            completion_ids.append(tokenizer.eos_token_id)
    if choice.finish_reason == "length":
        while completion_ids and completion_ids[-1] == tokenizer.eos_token_id:
            completion_ids.pop()
    return Turn(prompt_ids, completion_ids, None, "rerendered")


def history_turns(
    items: list[Any], tools: Any, tokenizer, policy: TurnPolicy
) -> Iterator[tuple[int, Turn | None]]:
    """Every sampled assistant turn of one history, in order, with its message index."""
    messages = get_messages(items)
    for index, item in enumerate(items):
        if isinstance(item, Choice):
            try:
                yield index, choice_turn(item, messages[:index], tools, tokenizer, policy)
            except TrainingDataError as error:
                raise type(error)(f"message {index}: {error}") from error


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


def join_turns(turns: Iterable[Turn]) -> list[tuple[list[int], list[bool], list[float]]]:
    """Turns joined into append-only sequences (ART's rule) of (ids, trained, logprobs): a turn
    whose prompt does not extend the tokens so far starts a new sequence."""
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
    return sequences


def assemble(turns: Iterable[Turn], advantage: float) -> list[Sample]:
    """RL samples of the turns' append-only sequences."""
    found = (sequence_sample(*sequence, advantage) for sequence in join_turns(turns))
    return [sample for sample in found if sample is not None]


def trajectory_samples(
    trajectory: art.Trajectory, advantage: float, tokenizer, policy: TurnPolicy
) -> tuple[list[Sample], TurnCounts]:
    """The trajectory's training sequences and its turns, counted by where their ids came from."""
    turns: list[Turn | None] = []
    if trajectory.exchanges:
        turns = exchange_turns(trajectory, tokenizer, policy)
    for h, (items, tools) in enumerate(histories(trajectory)):
        try:
            turns += [turn for _, turn in history_turns(items, tools, tokenizer, policy)]
        except TrainingDataError as error:
            where = "messages_and_choices" if h == 0 else f"additional_histories[{h - 1}]"
            raise type(error)(f"{where}, {error}") from error
    if not turns:
        raise TrainingDataError(
            "trajectory has no sampled Choice in messages_and_choices: record the model's "
            "response choice (not a plain dict) so it can be trained on"
        )
    counts = TurnCounts()
    counts.add(turns)
    return assemble([t for t in turns if t is not None], advantage), counts


def exchange_turns(trajectory: art.Trajectory, tokenizer, policy: TurnPolicy) -> list[Turn | None]:
    """The sampled turns of a trajectory recorded as `exchanges` (requests captured inside
    `with trajectory:`, ART 0.5.23): each choice of each chat-completion exchange of the policy
    model (chosen as ART's LocalBackend chooses it), on the ids the response carries or, where
    the client did not ask for them, the ids the server recorded. ART's own exchange tokenizer
    re-renders every recorded request with the raw chat template to find its roles, which fails
    on templates without tool support (the embedded model's); the served ids need no rendering."""
    from art.trajectories._selection import (
        automatic_training_model_selector,
        resolve_training_model,
    )

    exchanges = trajectory.exchanges
    if exchanges.completions or exchanges.responses or exchanges.messages:
        raise TrainingDataError(
            "only chat-completion exchanges can be trained here (TorchBackend serves "
            "/v1/chat/completions); the trajectory captured other protocols"
        )
    selector = automatic_training_model_selector(policy.model) if policy.model else None
    try:
        selected = resolve_training_model(trajectory, selector)
    except ValueError as error:
        raise TrainingDataError(str(error)) from error
    turns: list[Turn | None] = []
    for e, exchange in enumerate(exchanges.chat_completions):
        if exchange.model != selected:
            continue  # another model's calls (a judge, a teacher) are not the policy's turns
        request: dict[str, Any] = dict(exchange.request)  # the request's JSON as it was sent
        messages, tools = list(request.get("messages", [])), request.get("tools")
        for choice in exchange.response.choices:
            if "prompt_token_ids" not in (choice.model_extra or {}):
                prompt = (exchange.response.model_extra or {}).get("prompt_token_ids")
                if prompt is not None and "token_ids" in (choice.model_extra or {}):
                    choice = Choice.model_validate(
                        choice.model_dump() | {"prompt_token_ids": prompt}
                    )
            if choice.model_extra is None or "id" not in choice.model_extra:
                choice = Choice.model_validate(choice.model_dump() | {"id": exchange.response.id})
            try:
                turns.append(choice_turn(choice, messages, tools, tokenizer, policy))
            except TrainingDataError as error:
                raise type(error)(f"exchange {e}, choice {choice.index}: {error}") from error
    return turns


def samples_from_groups(
    groups: Iterable[art.TrajectoryGroup],
    tokenizer,
    *,
    scale_rewards: bool,
    policy: TurnPolicy | None = None,
) -> tuple[list[Sample], GroupStats]:
    policy = (policy or TurnPolicy()).fresh()
    samples: list[Sample] = []
    used = skipped = count = trained = 0
    counts = TurnCounts()
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
                found, turn_counts = trajectory_samples(trajectory, advantage, tokenizer, policy)
            except TrainingDataError as error:
                raise type(error)(f"group {g}, trajectory {t}: {error}") from error
            samples.extend(found)
            trained += bool(found)
            counts.merge(turn_counts)
    stats = GroupStats(used, skipped, count, trained_trajectories=trained, counts=counts)
    return samples, stats


def sft_samples(
    trajectories: Iterable[art.Trajectory],
    tokenizer,
    *,
    assistant_turns: AssistantTurns,
    served: ServedLog | None = None,
) -> tuple[list[SFTSample], TurnCounts]:
    """Each history (the main one and `additional_histories`, with their tools) as sequences
    in which only assistant tokens carry loss: every assistant message, or only the final one
    (which, as in ART's `TrainSFTConfig(assistant_turns="last")`, must end the conversation).
    A reply the server sampled for that very conversation trains on its served ids; any other
    is rendered by the chat template."""
    out: list[SFTSample] = []
    counts = TurnCounts()
    policy = TurnPolicy(served)
    for n, trajectory in enumerate(trajectories):
        if trajectory.exchanges:
            raise TrainingDataError(
                f"SFT trajectory {n} records `exchanges`; SFT reads `messages_and_choices` "
                "(as ART's tokenize_sft_batch does)"
            )
        try:
            for items, tools in histories(trajectory):
                turns = sft_turns(items, tools, tokenizer, assistant_turns, policy)
                counts.add(turns)
                out += [SFTSample(ids, mask) for ids, mask, _ in join_turns(turns)]
        except TrainingDataError as error:
            raise type(error)(f"SFT trajectory {n}: {error}") from error
    return out, counts


def sft_turns(
    items: list[Any],
    tools: Any,
    tokenizer,
    assistant_turns: AssistantTurns,
    policy: TurnPolicy,
) -> list[Turn]:
    messages = get_messages(items)
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistant_at:
        raise TrainingDataError("no assistant message to learn")
    if assistant_turns == "last" and assistant_at[-1] != len(messages) - 1:
        raise TrainingDataError(
            "assistant_turns='last' needs the final message to be the assistant's"
        )
    targets = assistant_at[-1:] if assistant_turns == "last" else assistant_at
    return [sft_turn(items[i], messages, i, tools, tokenizer, policy) for i in targets]


def sft_turn(
    item: Any, messages: list[Any], index: int, tools: Any, tokenizer, policy: TurnPolicy
) -> Turn:
    """Assistant message `index` as the server sampled it when it did so for this very
    conversation (the Choice's ids where its prompt is this conversation's rendering, or the
    server's record of the reply), else as the chat template renders it. SFT data is often
    edited (a relabelled prompt), so a Choice's ids alone are not trusted here."""
    prompt_ids = render_ids(tokenizer, messages[:index], tools)
    extra = (item.model_extra or {}) if isinstance(item, Choice) else {}
    if "token_ids" in extra and [int(t) for t in extra.get("prompt_token_ids", [])] == prompt_ids:
        return Turn(prompt_ids, [int(t) for t in extra["token_ids"]], None)
    if (found := policy.find(messages[:index], tools, item)) is not None:
        served_prompt, completion_ids, _ = found.as_lists()
        return Turn(served_prompt, completion_ids, None, "recovered")
    reply = rendered_reply(tokenizer, messages[: index + 1], tools)
    return Turn(prompt_ids, reply, None, "rerendered")
