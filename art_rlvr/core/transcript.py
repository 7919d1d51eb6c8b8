"""An episode as the reflection LM reads it: every turn labelled, trimmed to a character budget.

A multi-turn episode (the messages from the first sampled turn on, as
`art_rlvr.core.outcome.turns` gives them) is read as *turns*: one assistant message with the
messages that answer it (its tool results, then the environment's reply). Rendered, each
message is one labelled block: `[assistant] ...` with `[tool call] name(args)` lines,
`[tool result name] ...`, and `[environment] ...` for a user message after the opening (only
the environment speaks there).

Trimming rule, when the whole episode is longer than the budget: turns are admitted in this
order while they fit, and shown in episode order with `[… k turns omitted …]` where turns were
left out:

1. the last turn (how the episode ended);
2. the failing turns, latest first: a turn a tool answered with an error, or one the
   environment answered (an environment that accepts a turn ends the episode, so a turn it
   replies to was not the end: a wrong try, an illegal move, a failing test);
3. the first turn (how the episode began);
4. every other turn, latest first.

A turn that does not fit is skipped and the next one tried, so the budget is filled. If even
the last turn alone is over the budget, its middle is cut (`[… n characters cut …]`), keeping
its start and its end. A lone assistant reply without tool calls (a single-turn rollout) is its
bare text, as it always was, and is never trimmed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Message = Mapping[str, object]


def omitted(k: int) -> str:
    return f"[… {k} turn{'s' if k != 1 else ''} omitted …]"


def message_text(message: Message, *, environment: bool = False) -> str:
    """One message, labelled by role (a user message after the opening as `[environment]`),
    with its tool calls."""
    role = str(message.get("role", ""))
    content = str(message.get("content") or "")
    if role == "tool":
        name = f" {message['name']}" if message.get("name") else ""
        return f"[tool result{name}] {content}"
    label = "environment" if environment and role == "user" else role
    lines = [f"[{label}] {content}".rstrip()]
    calls = message.get("tool_calls") or []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") or {}
        lines.append(f"[tool call] {function.get('name')}({function.get('arguments') or ''})")
    return "\n".join(lines)


def split_turns(episode: Sequence[Message]) -> list[list[Message]]:
    """The episode cut before every assistant message (a leading non-assistant message, if
    any, is a turn of its own)."""
    out: list[list[Message]] = []
    for message in episode:
        if message.get("role") == "assistant" or not out:
            out.append([message])
        else:
            out[-1].append(message)
    return out


def failing(turn: Sequence[Message]) -> bool:
    """A tool answered the turn with an error, or the environment answered it."""
    return any(
        (m.get("role") == "tool" and str(m.get("content") or "").startswith("Error"))
        or m.get("role") == "user"
        for m in turn[1:]
    )


def priority(flags: Sequence[bool]) -> list[int]:
    """Turn indices in the order they are admitted: last, failing (latest first), first, rest
    (latest first)."""
    n = len(flags)
    last = [n - 1] if n else []
    fails = [i for i in reversed(range(n - 1)) if flags[i]]
    first = [0] if n > 1 and not flags[0] else []
    rest = [i for i in reversed(range(1, n - 1)) if not flags[i]]
    return [*last, *fails, *first, *rest]


def assemble(blocks: Sequence[str], kept: set[int]) -> str:
    """The kept turns in episode order, an omission marker for each run of left-out ones."""
    parts: list[str] = []
    gap = 0
    for i, block in enumerate(blocks):
        if i in kept:
            if gap:
                parts.append(omitted(gap))
            parts.append(block)
            gap = 0
        else:
            gap += 1
    if gap:
        parts.append(omitted(gap))
    return "\n".join(parts)


def clip(text: str, budget: int) -> str:
    """`text` cut in the middle to at most `budget` characters, start and end kept."""
    if len(text) <= budget:
        return text
    room = max(0, budget - len(f"\n[… {len(text)} characters cut …]\n"))
    head, tail = room // 2, room - room // 2
    mark = f"\n[… {len(text) - room} characters cut …]\n"
    return (text[:head] + mark + text[len(text) - tail :])[:budget]


def trim(blocks: Sequence[str], flags: Sequence[bool], budget: int) -> str:
    """The turns' texts kept by the rule in this module's docstring, within `budget`."""
    last = len(blocks) - 1
    if len(whole := assemble(blocks, set(range(len(blocks))))) <= budget:
        return whole
    if len(alone := assemble(blocks, {last})) > budget:
        marker = omitted(last) + "\n" if last else ""
        return marker + clip(blocks[last], max(0, budget - len(marker)))
    kept = {last}
    for i in priority(flags):
        if i not in kept and len(assemble(blocks, kept | {i})) <= budget:
            kept.add(i)
    return assemble(blocks, kept) if len(kept) > 1 else alone


def episode_text(episode: Sequence[Message], budget: int | None = None) -> str:
    """An episode as the reflection LM reads it (see the module docstring); `budget` caps its
    length in characters (None: the whole episode)."""
    lone = episode[0] if len(episode) == 1 else {}
    if lone.get("role") == "assistant" and not lone.get("tool_calls"):
        return str(lone.get("content") or "")
    turns = split_turns(episode)
    blocks = [
        "\n".join(message_text(m, environment=k > 0) for k, m in enumerate(turn)) for turn in turns
    ]
    if budget is None:
        return "\n".join(blocks)
    return trim(blocks, [failing(t) for t in turns], budget)


__all__ = ["episode_text", "failing", "message_text", "omitted", "priority", "split_turns"]
