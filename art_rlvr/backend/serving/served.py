"""What TorchBackend's server sampled, kept so that training uses exactly those tokens.

Clients drop token ids. LangChain (and with it ART's LangGraph integration) keeps none, the
OpenAI Agents SDK turns replies into its own items, and a user may rebuild messages from text.
Re-tokenising their text trains tokens the server never sampled: a `{"` sampled as two tokens
merges into one, a reply cut by `max_tokens` gains an end-of-turn token. So the server records
every completion it returns, under a key made of what every client keeps: the conversation it
was asked to continue and the reply it gave, as text (`skeleton`), plus the response id, which
LangChain and ART's exchange capture keep. The trainer finds the exact ids again from a
trajectory's messages (`ServedLog.find`).

The record is bounded (oldest first out) and compact: ids and logprobs as C arrays, a prompt's
ids shared by the `n` choices of one request.
"""

from __future__ import annotations

import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from art_rlvr.backend.chat.render import canonical_message, canonical_tools, text_content

DEFAULT_MAX_TURNS = 20_000  # ~40 MB at 250 tokens a turn; ART's off-policy trainers lag 4 steps


@dataclass(frozen=True)
class ServedTurn:
    """One completion as the server returned it: the exact ids it was sampled from and as."""

    response_id: str
    index: int
    prompt_ids: array  # shared by the choices of one request; do not mutate
    completion_ids: array
    logprobs: array
    finish_reason: str
    tools: str  # canonical JSON of the request's tools, "" without
    exact: str  # `turn_key` with the call ids

    def as_lists(self) -> tuple[list[int], list[int], list[float]]:
        return list(self.prompt_ids), list(self.completion_ids), list(self.logprobs)


def skeleton(message: object, *, ids: bool = False) -> list[object]:
    """What every client keeps of a message: role, text, and each tool call's name and parsed
    arguments (LangChain re-serialises them, the Agents SDK keeps the model's text); with `ids`,
    also the call ids and a tool result's `tool_call_id` (the chat template renders them, and
    the server makes a fresh one for every call, so they tell apart equal replies)."""
    m = canonical_message(message)
    role = "system" if m["role"] == "developer" else m["role"]
    calls = [
        [c["function"]["name"], _arguments_key(c["function"]["arguments"])]
        + ([c.get("id")] if ids else [])
        for c in m.get("tool_calls", [])
    ]
    found: list[object] = [role, text_content(m["content"]), calls]
    return [*found, m.get("tool_call_id")] if ids else found


def _arguments_key(arguments: object) -> str:
    if isinstance(arguments, str):
        text = arguments
        try:
            arguments = json.loads(text)
        except json.JSONDecodeError:
            return text
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def turn_key(messages: Sequence[object], reply: object, *, ids: bool = False) -> str:
    """The key of a reply to a conversation (`ids`: with its tool call ids)."""
    data = [[skeleton(m, ids=ids) for m in messages], skeleton(reply, ids=ids)]
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def tools_key(tools: Sequence[object] | None) -> str:
    canonical = canonical_tools(tools)
    return json.dumps(canonical, sort_keys=True, ensure_ascii=False) if canonical else ""


class ServedLog:
    """A bounded record of the completions one model's server returned (thread-safe: the server
    writes from its own thread, the trainer reads from another)."""

    def __init__(self, max_turns: int = DEFAULT_MAX_TURNS) -> None:
        self.max_turns = max_turns
        self._lock = threading.Lock()
        self._by_key: dict[str, list[ServedTurn]] = {}
        self._order: OrderedDict[tuple[str, int], tuple[str, ServedTurn]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def add(
        self,
        messages: Sequence[object],
        tools: Sequence[object] | None,
        response_id: str,
        prompt_ids: Sequence[int],
        replies: Sequence[tuple[dict[str, object], Sequence[int], Sequence[float], str]],
    ) -> None:
        """Record the choices of one response: (message returned, ids, logprobs, finish)."""
        prompt = array("l", prompt_ids)
        tools_text = tools_key(tools)
        entries = [
            (
                turn_key(messages, message),
                ServedTurn(
                    response_id,
                    index,
                    prompt,
                    array("l", ids),
                    array("d", logprobs),
                    finish_reason,
                    tools_text,
                    turn_key(messages, message, ids=True),
                ),
            )
            for index, (message, ids, logprobs, finish_reason) in enumerate(replies)
        ]
        with self._lock:
            for key, turn in entries:
                self._by_key.setdefault(key, []).append(turn)
                self._order[(response_id, turn.index)] = (key, turn)
            while len(self._order) > self.max_turns:
                _, (key, old) = self._order.popitem(last=False)
                kept = [t for t in self._by_key[key] if t is not old]
                if kept:
                    self._by_key[key] = kept
                else:
                    del self._by_key[key]

    def turns(self) -> list[ServedTurn]:
        """Every turn still recorded, oldest first: what the server was asked and answered."""
        with self._lock:
            return [turn for _, turn in self._order.values()]

    def by_id(self, response_id: str, index: int) -> ServedTurn | None:
        """The choice `index` of response `response_id`, if still recorded."""
        with self._lock:
            found = self._order.get((response_id, index))
        return found[1] if found else None

    def find(
        self,
        messages: Sequence[object],
        tools: Sequence[object] | None,
        reply: object,
        response_id: str | None = None,
        claimed: set[tuple[str, int]] | None = None,
    ) -> ServedTurn | None:
        """The served turn that answered `messages` with `reply`, or None.

        The response id decides when the client kept it. Else the turns whose key with call ids
        matches (failing those, a client that rewrote call ids, any), narrowed to those served
        with the same tools; none if their prompts still disagree. The same reply sampled twice
        for one conversation is two true samples: each is handed out once per `claimed` set
        (one training batch) before any is handed out again, oldest first."""
        with self._lock:
            candidates = list(self._by_key.get(turn_key(messages, reply), ()))
        if not candidates:
            return None
        if response_id is not None:
            for turn in candidates:
                if turn.response_id == response_id:
                    return _claim(turn, claimed)
        exact = turn_key(messages, reply, ids=True)
        pool = [t for t in candidates if t.exact == exact] or candidates
        wanted = tools_key(tools)
        pool = [t for t in pool if t.tools == wanted] or pool
        if len({tuple(t.prompt_ids) for t in pool}) > 1:
            return None
        claimed = set() if claimed is None else claimed
        free = [t for t in pool if (t.response_id, t.index) not in claimed]
        return _claim((free or pool)[0], claimed)


def _claim(turn: ServedTurn, claimed: set[tuple[str, int]] | None) -> ServedTurn:
    if claimed is not None:
        claimed.add((turn.response_id, turn.index))
    return turn
