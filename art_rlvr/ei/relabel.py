"""Relabelling: a verified completion becomes a training example under the *clean* prompt.

The example's prompt is rebuilt from the scenario (`scenario.messages(s)`: system `s`, user
from `x`), never taken from the hinted rollout, and the completion is carried as plain text:
the hinted rollout's `Choice` holds the hinted prompt's token ids (`prompt_token_ids`), which a
trainer would use verbatim, so it must not travel with the example.
"""

from __future__ import annotations

from collections.abc import Sequence

import art
from openai.types.chat.chat_completion import ChatCompletionMessage, Choice

from art_rlvr.ei.records import DistillExample, RLGroup
from art_rlvr.scenario import Scenario


def is_correct(trajectory: art.Trajectory) -> bool:
    """The reward's own verdict (`correct` metric), else full reward."""
    return float(trajectory.metrics.get("correct", trajectory.reward >= 1.0)) >= 1.0


def completion_text(trajectory: art.Trajectory) -> str:
    last = list(trajectory.messages_and_choices)[-1]
    if isinstance(last, Choice):
        return last.message.content or ""
    return str(last.get("content") or "") if isinstance(last, dict) else ""


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
    seen: set[str] = set()
    for t in ranked:
        text = completion_text(t).strip()
        if text and text not in seen:
            seen.add(text)
            out.append(t)
        if len(out) == keep:
            break
    return out


def clean_messages(scenario: Scenario, system_prompt: str | None) -> tuple[dict[str, str], ...]:
    """Exactly the messages a clean rollout of `scenario` sends."""
    return tuple(dict(m) for m in scenario.messages(system_prompt))


def example_from(
    scenario: Scenario,
    system_prompt: str | None,
    trajectory: art.Trajectory,
    source: str,
    hint_reliance: float | None = None,
) -> DistillExample:
    return DistillExample(
        scenario_id=scenario.id,
        messages=clean_messages(scenario, system_prompt),
        completion=completion_text(trajectory),
        reward=trajectory.reward,
        source=source,  # type: ignore[arg-type]
        completion_tokens=int(trajectory.metrics.get("completion_tokens", 0)),
        hint_reliance=hint_reliance,
    )


def relabel(example: DistillExample) -> art.Trajectory:
    """An SFT trajectory: the clean prompt and the completion as the assistant turn."""
    return art.Trajectory(
        messages_and_choices=[
            *[dict(m) for m in example.messages],
            {"role": "assistant", "content": example.completion},
        ],
        reward=example.reward,
        metadata={"scenario_id": example.scenario_id, "ei_source": example.source},
    )


def _bare_choice(text: str) -> Choice:
    """A sampled-looking choice with no token ids or logprobs, so the trainer re-tokenises the
    completion under the prompt it is given (the clean one)."""
    return Choice(
        index=0,
        finish_reason="stop",
        message=ChatCompletionMessage(role="assistant", content=text),
    )


def relabel_for_rl(group: RLGroup) -> art.TrajectoryGroup:
    """An ART group under the clean prompt: relabelled successes beside failed attempts."""
    return art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[*[dict(m) for m in group.messages], _bare_choice(text)],
                reward=reward,
                metadata={"scenario_id": group.scenario_id, "ei_relabelled": relabelled},
            )
            for text, reward, relabelled in zip(
                group.completions, group.rewards, group.relabelled, strict=True
            )
        ]
    )
