"""The trajectory contract: where a scored `art.Trajectory` keeps what its reward said.

Every rollout (a single reply or a multi-turn episode) ends in `attach_outcome`, and every reader
(training statistics, evaluation, GEPA, expert iteration, run files, the report) goes through
`outcome_of` / `is_correct` / `turns`, so "is this correct?" is decided in one place:

- `trajectory.reward`: R(x, trajectory) in [0, 1] for our rewards; any finite number for a
  user's rollout function (ART's rewards: -100 for an illegal move, 2 for a win);
- `trajectory.metrics["correct"]`: 1.0 or 0.0, always set (a reward may decide it; else
  reward >= the scenario's threshold, 1 by default), next to the reward's own metrics (format,
  turns, tool calls, ...);
- `trajectory.metadata["feedback"]`: the reward's feedback text for this trajectory;
- `trajectory.logs`: what happened on the way (tool errors, a turn cap), never the feedback;
- `trajectory.messages_and_choices`: the whole episode; every sampled assistant turn is the
  backend's `Choice` (token ids and logprobs kept for training), everything else plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, cast

from art_rlvr.core.types import CORRECT_THRESHOLD, Outcome, correct_from

if TYPE_CHECKING:
    import art
    from art.types import Choice, Message, MessageOrChoice, Tools
    from typing_extensions import TypeIs

    Item = MessageOrChoice | Mapping[str, object]  # an item of `messages_and_choices`


def attach_outcome(
    trajectory: art.Trajectory,
    *,
    reward: float,
    feedback: str,
    metrics: Mapping[str, float],
    correct_at: float = CORRECT_THRESHOLD,
) -> art.Trajectory:
    """Write a score into the trajectory's contract fields (in place; returned for chaining);
    without a `correct` metric, a reward >= `correct_at` is correct."""
    merged = {**trajectory.metrics, **{k: float(v) for k, v in metrics.items()}}
    merged["correct"] = float(correct_from(reward, merged, correct_at))
    trajectory.reward = reward
    trajectory.metrics = merged
    trajectory.metadata = {**trajectory.metadata, "feedback": feedback}
    return trajectory


def is_correct(trajectory: art.Trajectory) -> bool:
    return correct_from(trajectory.reward, trajectory.metrics)


def feedback_of(trajectory: art.Trajectory) -> str:
    value = trajectory.metadata.get("feedback")
    return value if isinstance(value, str) else ""


def outcome_of(trajectory: art.Trajectory) -> Outcome:
    """What the reward said about `trajectory`, read back from it."""
    return Outcome(
        reward=trajectory.reward,
        feedback=feedback_of(trajectory),
        metrics={k: float(v) for k, v in trajectory.metrics.items()},
    )


def as_message(item: Item) -> dict[str, object]:
    """A message dict for an item of `messages_and_choices`: a sampled `Choice` becomes the
    assistant message it carried (content and tool calls), a dict is copied as it is."""
    if not is_sampled(item):
        return dict(item)
    message = item.message
    out: dict[str, object] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [call.model_dump(mode="json") for call in message.tool_calls]
    return out


def art_message(message: Mapping[str, object]) -> Message:
    """A message built at run time (a prompt, a tool result, an environment's reply) as ART's
    `Message`, OpenAI's TypedDict union, which ART does not validate either: the one place a
    plain dict is declared to be one."""
    return cast("Message", dict(message))


def art_tools(tools: Iterable[Mapping[str, object]]) -> Tools:
    """Tool schemas built at run time as ART's `Tools` (OpenAI's TypedDicts), likewise."""
    return cast("Tools", list(tools))


def episode_items(trajectory: art.Trajectory) -> list[MessageOrChoice]:
    """`messages_and_choices`; for a trajectory recorded only as ART's `exchanges` (a rollout
    function inside a capture scope), the last chat exchange as the same kind of list: its
    request's messages, then its first choice (an agent's last request holds its history)."""
    if trajectory.messages_and_choices or not trajectory.exchanges:
        return list(trajectory.messages_and_choices)
    exchanges = trajectory.exchanges.chat_completions
    if not exchanges:
        return []
    last = exchanges[-1]
    choices = list(last.response.choices)[:1]
    return [art_message(m) for m in last.request.get("messages", [])] + choices


def turns(trajectory: art.Trajectory) -> list[dict[str, object]]:
    """The whole episode as message dicts, in order (sampled turns included)."""
    return [as_message(item) for item in episode_items(trajectory)]


def is_sampled(item: Item) -> TypeIs[Choice]:
    """True for a turn the policy sampled (a `Choice`), False for a given message."""
    return not isinstance(item, Mapping)


def completion_text(trajectory: art.Trajectory) -> str:
    """The last sampled assistant turn's text ('' if it had none): what a single-turn reward
    scores."""
    sampled = [i for i in episode_items(trajectory) if is_sampled(i)]
    return (sampled[-1].message.content or "") if sampled else ""
