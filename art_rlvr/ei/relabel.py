"""Relabelling: a verified episode becomes training data under the *clean* prompt.

A hint goes only into the opening of an episode (the messages before its first sampled turn;
`hinted_prompt` appends it to the last user message there). `relabel_episode` works on the
`art.Trajectory` itself: it swaps that opening for the clean one (rebuilt from the scenario,
never taken from the rollout) and keeps every later turn, tool results and the environment's
messages as they were and each sampled `Choice` with its text and tool calls. A rollout
function builds its own messages, so its hint goes into the system prompt it is handed
(`hinted_system`) and `relabel_function_episode` puts the clean system prompt back in that one
message. `hint_leaks` then checks every turn of the relabelled episode for the hint. The round
buffer keeps the episode after its opening (`Episode`, JSON), so SFT (`relabel`) and RL
(`relabel_for_rl`) rebuild the same trajectories after a resume.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Literal

import art
from art.types import MessageOrChoice
from openai.types.chat.chat_completion import Choice

from art_rlvr.core.outcome import (
    art_message,
    art_tools,
    as_message,
    completion_text,
    is_correct,
    is_sampled,
    turns,
)
from art_rlvr.core.outcome import episode_items as trajectory_items
from art_rlvr.ei.data import DistillExample, Episode, RLGroup
from art_rlvr.ei.hints import echoes_hint, hinted_prompt, hinted_system
from art_rlvr.scenarios.leakage import quotes
from art_rlvr.scenarios.scenario import Example


def clean_messages(example: Example, system_prompt: str | None) -> tuple[dict[str, str], ...]:
    """Exactly the messages a clean rollout of `example` sends."""
    return tuple(dict(m) for m in example.messages(system_prompt))


def opening_of(trajectory: art.Trajectory) -> tuple[dict[str, object], ...]:
    """The messages before a trajectory's first sampled turn (for a rollout function's captured
    exchanges, those of its last request)."""
    items = trajectory_items(trajectory)
    first = next((i for i, item in enumerate(items) if is_sampled(item)), len(items))
    return tuple(dict(m) for m in items[:first])


def clean_opening(
    example: Example, system_prompt: str | None, trajectory: art.Trajectory
) -> tuple[dict[str, object], ...]:
    """The prompt an attempt is distilled under: the scenario's own, rebuilt (never taken from
    a rollout); a rollout function builds its own, so its clean or relabelled attempt's."""
    if example.scenario.rollout_fn is None:
        return tuple(dict(m) for m in clean_messages(example, system_prompt))
    return opening_of(trajectory)


def shared_opening(example: Example, system_prompt: str | None) -> tuple[dict[str, str], ...]:
    """The prompt a `distill=rl` group shares: the scenario's clean one. A rollout function's
    episodes each keep their own opening (an agent may word it differently every time)."""
    return () if example.scenario.rollout_fn is not None else clean_messages(example, system_prompt)


def relabel_hinted_episode(
    example: Example, system_prompt: str | None, trajectory: art.Trajectory, hint: str
) -> art.Trajectory | None:
    """A hinted episode under the clean prompt, wherever the hint went in (None: a rollout
    function's episode that cannot be relabelled)."""
    if example.scenario.rollout_fn is None:
        return relabel_episode(trajectory, clean_messages(example, system_prompt), hint)
    clean = example.scenario.default_system_prompt if system_prompt is None else system_prompt
    return relabel_function_episode(trajectory, clean, hinted_system(clean, hint))


def message_text(message: Mapping[str, object]) -> str:
    """The words a message carries: its content (a string or text parts) and its tool calls."""
    content = message.get("content")
    parts = (
        [content]
        if isinstance(content, str)
        else [str(p.get("text", "")) for p in _items(content) if isinstance(p, Mapping)]
    )
    calls = [
        json.dumps(c.get("function", c) if isinstance(c, Mapping) else c)
        for c in _items(message.get("tool_calls"))
    ]
    return "\n".join([*parts, *calls])


def _items(value: object) -> Sequence[object]:
    """A message field that holds a list (text parts, tool calls): its items; none if unset."""
    return value if isinstance(value, list | tuple) else ()


def attempt_key(trajectory: art.Trajectory) -> tuple[str, ...]:
    """What makes two attempts the same: the text of each sampled turn (tool calls included)."""
    return tuple(
        message_text(as_message(item)).strip()
        for item in trajectory_items(trajectory)
        if is_sampled(item)
    )


def best_attempts(trajectories: Sequence[art.Trajectory], keep: int) -> list[art.Trajectory]:
    """Up to `keep` distinct correct attempts, best first: highest reward, then the strict
    format (a bare answer), then the shortest, then sampling order (deterministic)."""
    ranked = sorted(
        (t for t in trajectories if is_correct(t)),
        key=lambda t: (
            -t.reward,
            -float(t.metrics.get("format", 0.0)),
            float(t.metrics.get("completion_tokens", 0.0)),
        ),
    )
    out: list[art.Trajectory] = []
    seen: set[tuple[str, ...]] = set()
    for t in ranked:
        key = attempt_key(t)
        if any(key) and key not in seen:
            seen.add(key)
            out.append(t)
        if len(out) == keep:
            break
    return out


def without_token_data(choice: Choice) -> Choice:
    """The sampled turn with its text and tool calls but no token ids or logprobs."""
    return Choice.model_validate(
        choice.model_dump(include=set(Choice.model_fields)) | {"logprobs": None}
    )


def relabel_episode(
    trajectory: art.Trajectory, clean: Sequence[Mapping[str, object]], hint: str
) -> art.Trajectory:
    """The hinted episode under the clean opening: every later turn kept, in order.

    Raises ValueError if the episode does not open with `hinted_prompt(clean, hint)`: the hint
    must have gone into the opening and nowhere else, or swapping the opening would not
    remove it."""
    items = list(trajectory.messages_and_choices)
    opening = [dict(m) for m in clean]
    head = items[: len(opening)]
    if any(is_sampled(i) for i in head) or [dict(i) for i in head] != hinted_prompt(clean, hint):
        raise ValueError(
            f"episode of {trajectory.metadata.get('scenario_id')!r} does not open with the "
            "hinted prompt it is relabelled from"
        )
    if trajectory.additional_histories:
        raise ValueError("relabelling covers messages_and_choices, not additional_histories")
    # Every turn was sampled after the hinted opening: its prompt_token_ids contain the hint and
    # its logprobs are p(turn | hinted), not the clean-prompt policy it is trained as, so both
    # go; the trainer re-renders each turn under the clean prompt and trains it on-policy (SFT
    # only ever uses the text).
    return relabelled(trajectory, opening, items[len(opening) :])


def relabelled(
    trajectory: art.Trajectory,
    opening: Sequence[Mapping[str, object]],
    later: Sequence[MessageOrChoice],
) -> art.Trajectory:
    """`trajectory` as the clean `opening` then its `later` items, sampled turns without the
    token data they got under the hinted prompt."""
    return art.Trajectory(
        messages_and_choices=[
            *[art_message(m) for m in opening],
            *[art_message(i) if isinstance(i, Mapping) else without_token_data(i) for i in later],
        ],
        tools=trajectory.tools,
        reward=trajectory.reward,
        metrics=dict(trajectory.metrics),
        metadata={**trajectory.metadata, "hinted": False, "relabelled": True},
        logs=list(trajectory.logs),
    )


def relabel_function_episode(
    trajectory: art.Trajectory, clean_system: str, hinted_system: str
) -> art.Trajectory | None:
    """A rollout function's hinted episode with its clean system prompt back in the one
    system message that carried `hinted_system` (dropped if the clean prompt is empty); None
    where the function did not send that prompt verbatim before its first sampled turn, or
    kept more than one history: then there is nothing art_rlvr can relabel."""
    opening = list(opening_of(trajectory))
    at = [
        i
        for i, m in enumerate(opening)
        if m.get("role") == "system" and m.get("content") == hinted_system
    ]
    if len(at) != 1 or trajectory.additional_histories:
        return None
    later = trajectory_items(trajectory)[len(opening) :]
    opening[at[0] : at[0] + 1] = (
        [{**opening[at[0]], "content": clean_system}] if clean_system else []
    )
    return relabelled(trajectory, opening, later)


def hint_leaks(trajectory: art.Trajectory, hint: str, opening: int = 0) -> list[int]:
    """Indices of the turns that carry the hint; every turn is checked. A sampled turn may not
    quote it (`echoes_hint`: four words in a row, or the word "hint"), nor may a given turn
    after the opening (a tool result, the environment's reply); the first `opening` messages,
    the clean prompt (which may share a phrase with a hint about it), may not hold all of it."""
    items = trajectory_items(trajectory)
    texts = [message_text(m) for m in turns(trajectory)]
    return [
        index
        for index, (item, text) in enumerate(zip(items, texts, strict=True))
        if (
            echoes_hint(text, hint)
            if is_sampled(item)
            else quotes(text, hint, None if index < opening else 4)
        )
    ]


def episode_of(trajectory: art.Trajectory, opening: int, *, token_data: bool) -> Episode:
    """The turns after the first `opening` messages, as the buffer stores them; `token_data`
    keeps each sampled turn's token ids and logprobs (valid only under the prompt they were
    sampled with)."""
    items = trajectory_items(trajectory)[opening:]
    return Episode(
        turns=tuple(
            (i if token_data else without_token_data(i)).model_dump(mode="json")
            if is_sampled(i)
            else dict(i)
            for i in items
        ),
        sampled=tuple(map(is_sampled, items)),
        tools=tuple(dict(t) for t in trajectory.tools) if trajectory.tools else None,
    )


def episode_items(episode: Episode) -> list[MessageOrChoice]:
    """The stored turns as `messages_and_choices` items: sampled ones as `Choice`s again."""
    return [
        Choice.model_validate(turn) if sampled else art_message(turn)
        for turn, sampled in zip(episode.turns, episode.sampled, strict=True)
    ]


def example_from(
    example: Example,
    system_prompt: str | None,
    trajectory: art.Trajectory,
    source: Literal["clean", "hinted"],
    hint_reliance: float | None = None,
) -> DistillExample:
    """An SFT example: the clean prompt and the episode's turns after its opening (SFT learns
    text only, so no token data is stored)."""
    messages = clean_opening(example, system_prompt, trajectory)
    return DistillExample(
        scenario_id=example.id,
        messages=messages,
        completion=completion_text(trajectory),
        reward=trajectory.reward,
        source=source,
        completion_tokens=int(trajectory.metrics.get("completion_tokens", 0)),
        hint_reliance=hint_reliance,
        episode=episode_of(trajectory, len(messages), token_data=False),
    )


def relabel(example: DistillExample) -> art.Trajectory:
    """An SFT trajectory: the clean prompt, then every turn of the episode as a message (ART's
    `train_sft` learns every assistant message's text)."""
    return art.Trajectory(
        messages_and_choices=[
            *[art_message(m) for m in example.messages],
            *[art_message(as_message(i)) for i in episode_items(example.episode)],
        ],
        tools=art_tools(example.episode.tools) if example.episode.tools else None,
        reward=example.reward,
        metadata={"scenario_id": example.scenario_id, "ei_source": example.source},
    )


def rl_group(
    scenario_id: str,
    messages: Sequence[dict[str, str]],
    trajectories: Sequence[tuple[art.Trajectory, bool]],
) -> RLGroup:
    """A `distill=rl` group from (trajectory, relabelled) pairs under the clean `messages`.
    Clean attempts keep their token data (sampled under this very prompt); relabelled ones
    have none left."""
    return RLGroup(
        scenario_id=scenario_id,
        messages=tuple(messages),
        completions=tuple(completion_text(t) for t, _ in trajectories),
        rewards=tuple(t.reward for t, _ in trajectories),
        relabelled=tuple(r for _, r in trajectories),
        episodes=tuple(episode_of(t, len(messages), token_data=True) for t, _ in trajectories),
    )


def relabel_for_rl(group: RLGroup) -> art.TrajectoryGroup:
    """An ART group under the clean prompt: relabelled successes beside failed attempts."""
    return art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[
                    *[art_message(m) for m in group.messages],
                    *episode_items(ep),
                ],
                tools=art_tools(ep.tools) if ep.tools else None,
                reward=reward,
                metadata={"scenario_id": group.scenario_id, "ei_relabelled": relabelled},
            )
            for ep, reward, relabelled in zip(
                group.episodes, group.rewards, group.relabelled, strict=True
            )
        ]
    )
