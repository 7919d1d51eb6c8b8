"""Teacher hints that do not give the answer away.

The teacher (any litellm model; with no key, the embedded model through its own endpoint) sees
the problem as the student saw it, the gold answer, the reference solution where the record has
one, and the student's failed attempt, and is told to write a short hint without the answer.
The deterministic leak check (`scenarios.leakage`) enforces that: a hint stating the answer in
any normalised form is refused and the teacher is asked again, up to `max_hint_attempts`
replies, after which the scenario is dropped for the round. Hints are bounded by
`max_hint_chars` (cut at a word boundary). A teacher call that fails after its retries is
counted and the scenario skipped; the run goes on. Only a fatal error (a missing or refused
key) stops the run, because every later call would fail the same way.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

from art_rlvr.core.types import Message, Messages
from art_rlvr.ei.config import EIConfig
from art_rlvr.ei.data import HintAttempt, HintRecord
from art_rlvr.llm.client import LLMClient, LLMCounters, LLMError, client_for
from art_rlvr.observe import tracing
from art_rlvr.scenarios.leakage import leaks, quotes, words

log = logging.getLogger(__name__)

HINT_PREFIX = "Hint: "

TEACHER_SYSTEM = (
    "You are a patient teacher. A student answered a problem wrongly. Write ONE short hint "
    "that helps the student solve it on their own: point at the method, an intermediate step, "
    "or the mistake in their attempt. Never state the final answer or any number, word or "
    "expression equal to it, not even as a check. Reply with the hint only, at most "
    "{max_chars} characters."
)

RETRY_LEAK = (
    "That hint gives the final answer away. Write a different hint that does not contain the "
    "answer in any form (digits, words, fractions, LaTeX). Reply with the hint only."
)
RETRY_EMPTY = "That reply had no usable hint. Reply with one short hint only."


class HintOutcome(BaseModel):
    """A hint (or why there is none) and what getting it cost."""

    model_config = ConfigDict(frozen=True)

    record: HintRecord
    calls: int

    @property
    def hint(self) -> str | None:
        return self.record.hint

    @property
    def leak_rejected(self) -> int:
        return sum(a.verdict == "leak" for a in self.record.attempts)


def teacher_messages(
    problem: str,
    answer: str,
    *,
    solution: str | None,
    attempt: str | None,
    max_chars: int,
) -> list[dict[str, str]]:
    """The teacher's first request: the problem as the student saw it, the gold answer and
    the reference solution (for the teacher only), the student's failed attempt."""
    parts = [
        f"Problem the student was given:\n{problem}",
        f"Correct final answer (for you only; do NOT reveal it): {answer}",
    ]
    if solution:
        parts.append(f"Reference solution (for you only):\n{solution}")
    if attempt is not None:
        parts.append(f"The student's wrong attempt:\n{attempt.strip() or '(an empty reply)'}")
    parts.append("Write the hint now.")
    return [
        {"role": "system", "content": TEACHER_SYSTEM.format(max_chars=max_chars)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def clean_hint(reply: str, max_chars: int) -> tuple[str, bool]:
    """(hint, truncated): the reply without a 'Hint:' label or quotes, cut at a word boundary
    to `max_chars` if longer."""
    text = reply.strip()
    text = re.sub(r"^\**\s*hint\s*\**\s*:\s*\**", "", text, flags=re.IGNORECASE).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1].strip()
    if len(text) <= max_chars:
        return text, False
    cut = text[:max_chars]
    space = cut.rfind(" ")
    cut = cut[:space] if space > max_chars // 2 else cut
    return cut.rstrip(" ,;:-"), True


def echoes_hint(completion: str, hint: str, n: int = 4) -> bool:
    """Whether a hinted completion quotes its hint (any `n` consecutive words, all of a shorter
    hint, or the word "hint"): relabelled to the clean prompt, such a completion would teach
    the student to reproduce text it was never shown."""
    return "hint" in words(completion) or quotes(completion, hint, n)


def hinted_prompt(messages: Messages, hint: str) -> list[Message]:
    """The clean messages with the hint appended to the last user turn."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = f"{m['content']}\n\n{HINT_PREFIX}{hint}"
            return out
    raise ValueError("no user message to attach a hint to")


def hinted_system(system_prompt: str, hint: str) -> str:
    """The system prompt a rollout function's hinted attempts receive: the clean one, then the
    hint. A rollout function builds its own messages, so its system prompt (which it must send
    verbatim, as for GEPA) is the one place art_rlvr can put a hint and find it again."""
    return f"{system_prompt}\n\n{HINT_PREFIX}{hint}" if system_prompt else f"{HINT_PREFIX}{hint}"


def hint_messages(
    messages: list[dict[str, str]], previous_reply: str, verdict: str
) -> list[dict[str, str]]:
    """The conversation continued after a refused reply."""
    again = RETRY_LEAK if verdict == "leak" else RETRY_EMPTY
    return [
        *messages,
        {"role": "assistant", "content": previous_reply},
        {"role": "user", "content": again},
    ]


@tracing.op("art_rlvr.ei.hint", inputs=tracing.drop("client", "config"))
async def obtain_hint(
    client: LLMClient,
    *,
    scenario_id: str,
    problem: str,
    answer: str,
    solution: str | None,
    attempt: str | None,
    config: EIConfig,
) -> HintOutcome:
    """Ask until a hint passes the leak check, up to `max_hint_attempts` replies."""
    messages = teacher_messages(
        problem, answer, solution=solution, attempt=attempt, max_chars=config.max_hint_chars
    )
    attempts: list[HintAttempt] = []
    for number in range(1, config.max_hint_attempts + 1):
        try:
            reply = await client.acomplete(messages)
        except LLMError as error:
            if error.fatal:
                raise
            log.warning("teacher failed for %s: %s; skipping it this round", scenario_id, error)
            attempts.append(HintAttempt(text="", verdict="error", detail=str(error)[:300]))
            record = HintRecord(
                scenario_id=scenario_id, attempts=tuple(attempts), dropped="teacher_error"
            )
            return HintOutcome(record=record, calls=number)
        hint, truncated = clean_hint(reply.text, config.max_hint_chars)
        verdict: Literal["empty", "leak"]
        if not hint:
            verdict, detail = "empty", "no hint text in the reply"
        elif leaks(hint, answer):
            verdict, detail = "leak", "states the final answer"
        else:
            attempts.append(HintAttempt(text=hint, verdict="accepted"))
            record = HintRecord(
                scenario_id=scenario_id, attempts=tuple(attempts), hint=hint, truncated=truncated
            )
            return HintOutcome(record=record, calls=number)
        attempts.append(HintAttempt(text=hint, verdict=verdict, detail=detail))
        messages = hint_messages(messages, reply.text, verdict)
    dropped: Literal["leak", "empty"] = (
        "leak" if any(a.verdict == "leak" for a in attempts) else "empty"
    )
    log.info(
        "no usable hint for %s after %d replies (%s); dropped this round",
        scenario_id,
        len(attempts),
        dropped,
    )
    record = HintRecord(scenario_id=scenario_id, attempts=tuple(attempts), dropped=dropped)
    return HintOutcome(record=record, calls=len(attempts))


def make_teacher(model: object, config: EIConfig, counters: LLMCounters) -> tuple[LLMClient, str]:
    """The configured teacher, or the embedded model through its own endpoint."""
    return client_for(config.teacher, model, name="teacher", counters=counters)
