"""Episode-to-text (`art_rlvr.core.transcript`), what GEPA's reflector and EI's teacher read: a
whole episode rendered turn by turn and trimmed to a character budget that keeps the last and
the failing turns, every left-out turn counted by a marker."""

from __future__ import annotations

import re
from typing import Any

import pytest

from art_rlvr.core.transcript import assemble, episode_text, failing, message_text, split_turns

MARKER = re.compile(r"\[… (\d+) turns? omitted …\]")


def synthetic(n: int, fails: set[int], width: int = 40) -> list[dict[str, Any]]:
    """`n` assistant turns, each rendered to the same length; turn i is answered by the
    environment when i is in `fails`."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        reply = {"role": "user", "content": f"turn{i} was wrong, try again"}
        pad = 0 if i in fails else len("\n" + message_text(reply, environment=True))
        out.append({"role": "assistant", "content": f"turn{i} " + "x" * (width + pad)})
        if i in fails:
            out.append(reply)
    return out


def kept_turns(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"\[assistant\] turn(\d+) ", text)]


@pytest.mark.parametrize(
    ("n", "fails", "budget"),
    [
        (6, {1, 3}, 200),
        (6, {1, 3}, 300),
        (8, {0, 2, 4, 6}, 250),
        (8, {5}, 180),
        (10, set(), 220),
        (10, {9}, 160),
        (4, {0, 1, 2}, 120),
        (3, {0, 1}, 10_000),
    ],
)
def test_trimming_keeps_last_and_failing_turns_within_budget(n, fails, budget) -> None:
    episode = synthetic(n, fails)
    turns = split_turns(episode)
    text = episode_text(episode, budget)
    kept = kept_turns(text)
    omitted = sum(int(k) for k in MARKER.findall(text))
    assert len(text) <= budget
    assert kept == sorted(kept) and kept[-1] == n - 1  # episode order, the end always shown
    assert len(kept) + omitted == n  # every left-out turn is counted by a marker
    if omitted == 0:
        assert text == episode_text(episode)  # nothing to trim: the whole episode, unchanged
    # turns are admitted last, failing (latest first), first, rest: a failing turn is left out
    # only when it does not fit beside the turns kept (a shorter, later-ranked one may)
    blocks = ["\n".join(message_text(m, environment=k > 0) for k, m in enumerate(t)) for t in turns]
    for f in fails - set(kept):
        assert len(assemble(blocks, {*kept, f})) > budget, (f, kept)
    # blocks are of one length here, so the order is strict: no other turn (but the first,
    # ranked right after them) is kept while a failing one is left out
    if [i for i in kept if i not in fails and i not in (0, n - 1)]:
        assert fails <= set(kept), (fails, kept)
    # the environment's reply stays with the turn it answers
    for i in kept:
        assert (f"[environment] turn{i} was wrong" in text) == (i in fails)


def test_an_overlong_last_turn_is_cut_in_the_middle() -> None:
    episode = [
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "wrong"},
        {"role": "assistant", "content": "BEGIN " + "y" * 2000 + " END"},
    ]
    text = episode_text(episode, 300)
    assert len(text) <= 300 and text.startswith("[… 1 turn omitted …]")
    assert "[assistant] BEGIN" in text and text.endswith(" END") and "characters cut" in text


def test_failing_turns_are_tool_errors_and_environment_replies() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    episode = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "Error: missing argument 'a'"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    assert [failing(t) for t in split_turns(episode)] == [True, False, False]
