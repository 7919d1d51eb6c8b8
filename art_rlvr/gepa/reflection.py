"""Reflection: what the LM is shown, and which of its replies may become a candidate.

Pure functions. The stricter rules are what gepa 0.1.4 lacks: a reply needs a *complete* fenced
block (a reply cut off mid-fence is rejected, not adopted), a proposal must fit the prompt
length budget, must not copy a shown example's gold answer, and must not repeat a prompt that
was already rejected or is already in the pool. Rejected proposals are shown back to the LM.
The check returns a `Verdict` whose `rejection` kind is decided with the reason, never read
back out of the reason's words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gepa.strategies.instruction_proposal import InstructionProposalSignature
from pydantic import BaseModel, ConfigDict

from art_rlvr.core.transcript import episode_text
from art_rlvr.gepa.data import ExampleEval, Rejection, RejectionKind, RolloutTrace
from art_rlvr.scenarios.leakage import leaked_answers
from art_rlvr.scenarios.scenario import Example

# gepa 0.1.4's default reflection prompt, plus our rules and the rejected proposals
REFLECTION_TEMPLATE = "\n\n".join(
    [
        "I provided an assistant with the following instructions to perform a task for me:\n"
        "```\n<curr_param>\n```",
        "The following are examples of different task inputs provided to the assistant along "
        "with the assistant's response for each of them, and some feedback on how the "
        "assistant's response could be better (failures first, then successes for contrast):\n"
        "```\n<side_info>\n```",
        "Your task is to write a new instruction for the assistant.",
        "Read the inputs carefully and identify the input format and infer detailed task "
        "description about the task I wish to solve with the assistant.",
        "Read all the assistant responses and the corresponding feedback. Identify all niche and "
        "domain specific factual information about the task and include it in the instruction, "
        "as a lot of it may not be available to the assistant in the future. The assistant may "
        "have utilized a generalizable strategy to solve the task, if so, include that in the "
        "instruction as well.",
        "Rules for the new instruction:\n"
        "- It must work for new inputs: never copy an example's expected answer into it.\n"
        "- It must be at most <max_chars> characters long.\n"
        "<rejected>\n"
        "Provide the new instructions within ``` blocks.",
    ]
)

MERGE_TEMPLATE = "\n\n".join(
    [
        "Two instructions for the same task each work best on different examples.",
        "Instruction A:\n```\n<prompt_a>\n```",
        "Instruction B:\n```\n<prompt_b>\n```",
        "Write one new instruction that keeps what makes each of them work, so that it does as "
        "well as the better of the two on every example.",
        "Rules for the new instruction:\n"
        "- It must work for new inputs: do not copy answers to specific examples into it.\n"
        "- It must be at most <max_chars> characters long.\n"
        "<rejected>\n"
        "Provide the new instructions within ``` blocks.",
    ]
)


def normalize(prompt: str) -> str:
    """Whitespace- and case-insensitive identity of a prompt (for duplicate checks)."""
    return " ".join(prompt.split()).casefold()


def shown_output(rollout: RolloutTrace, max_chars: int | None = None) -> str:
    """What the reflection LM sees of a rollout: its whole episode when one was recorded,
    trimmed to `max_chars` (art_rlvr.core.transcript says which turns stay)."""
    return episode_text(rollout.episode, max_chars) if rollout.episode else rollout.output


def reflective_records(
    evals: Sequence[ExampleEval], limit: int, max_chars: int | None = None
) -> list[dict[str, str]]:
    """gepa's reflective-dataset rows ("Inputs", "Generated Outputs", "Feedback") from
    trajectory groups: failures first (each scenario's worst rollout before anyone's second),
    then up to a quarter of the rows as successes for contrast, preferring scenarios that also
    failed. Identical outputs of one scenario are shown once. A multi-turn episode is shown
    turn by turn within `max_chars` characters (None: whole)."""
    failures: list[tuple[int, float, ExampleEval, int]] = []
    successes: list[tuple[int, ExampleEval, int]] = []
    for ev in evals:
        seen: set[str] = set()
        ranked = sorted(range(len(ev.rollouts)), key=lambda k: ev.rollouts[k].reward)
        rank = 0
        for k in ranked:
            r = ev.rollouts[k]
            shown = shown_output(r, max_chars)
            if shown in seen:
                continue
            seen.add(shown)
            if r.reward < 1.0:
                failures.append((rank, r.reward, ev, k))
            else:
                successes.append((rank, ev, k))
            rank += 1
    failures.sort(key=lambda f: (f[0], f[1]))
    n_success = min(len(successes), max(1, limit // 4) if failures else limit)
    shown_failures = failures[: limit - n_success]
    failed_ids = {ev.scenario_id for _, _, ev, _ in shown_failures}
    # the sharpest contrast: a success on a scenario that also failed
    successes.sort(key=lambda s: (s[1].scenario_id not in failed_ids, s[0]))
    picked = [(ev, k) for _, _, ev, k in shown_failures]
    picked += [(ev, k) for _, ev, k in successes[:n_success]]
    return [
        {
            "Inputs": ev.inputs,
            "Generated Outputs": shown_output(ev.rollouts[k], max_chars) or "(empty reply)",
            "Feedback": f"reward {ev.rollouts[k].reward:.2f}: {ev.rollouts[k].feedback}"
            + (" (cut off at the token limit)" if ev.rollouts[k].truncated else ""),
        }
        for ev, k in picked
    ]


def quote(text: str) -> str:
    return "\n".join(f"    > {line}" for line in text.splitlines() or [""])


def rejected_section(rejections: Sequence[Rejection], max_chars: int = 600) -> str:
    """The rejected proposals, quoted (not fenced, so an echo cannot pass as the answer)."""
    if not rejections:
        return ""
    lines = ["- These instructions were already tried and rejected; do not propose them again:"]
    for n, rejection in enumerate(rejections, 1):
        text = rejection.prompt
        text = text if len(text) <= max_chars else text[: max_chars - 3] + "..."
        lines.append(f"  {n}. rejected because: {rejection.reason}")
        lines.append(quote(text))
    return "\n".join(lines) + "\n"


def reflection_messages(
    prompt: str,
    dataset: Sequence[Mapping[str, str]],
    rejections: Sequence[Rejection],
    max_chars: int,
) -> list[dict[str, str]]:
    template = REFLECTION_TEMPLATE.replace("<max_chars>", str(max_chars)).replace(
        "<rejected>", rejected_section(rejections)
    )
    text = InstructionProposalSignature.prompt_renderer(
        {
            "current_instruction_doc": prompt,
            "dataset_with_feedback": list(dataset),
            "prompt_template": template,
        }
    )
    assert isinstance(text, str)  # no images in our datasets
    return [{"role": "user", "content": text}]


def merge_messages(
    prompt_a: str, prompt_b: str, rejections: Sequence[Rejection], max_chars: int
) -> list[dict[str, str]]:
    text = (
        MERGE_TEMPLATE.replace("<max_chars>", str(max_chars))
        .replace("<rejected>", rejected_section(rejections))
        .replace("<prompt_a>", prompt_a)
        .replace("<prompt_b>", prompt_b)
    )
    return [{"role": "user", "content": text}]


def extract_fenced(reply: str) -> str | None:
    """The last *complete* ``` block of a reply (an opening fence may name a language), or
    None. Unlike gepa 0.1.4, a block whose closing fence never came is not a proposal."""
    blocks: list[str] = []
    opened: int | None = None
    lines = reply.split("\n")
    for i, line in enumerate(lines):
        stripped = line.strip()
        if opened is None:
            if stripped.startswith("```"):
                inline = stripped[3:]
                if inline.endswith("```") and len(inline) > 3:
                    blocks.append(inline[:-3])  # ```one line```
                else:
                    opened = i
        elif stripped == "```":
            blocks.append("\n".join(lines[opened + 1 : i]))
            opened = None
    return blocks[-1].strip() if blocks else None


def gold_answers_for_leak_check(examples: Iterable[Example], answer_field: str) -> list[str]:
    """The gold answers of the examples the reflection LM was shown, read from the record's
    `answer_field`. This is the only place GEPA looks inside a record, and only to refuse a
    prompt that copies an answer; records without the field are not checked."""
    return [
        str(example.x[answer_field]).strip()
        for example in examples
        if answer_field in example.x and str(example.x[answer_field]).strip()
    ]


class Verdict(BaseModel):
    """The proposal check's answer: the fenced prompt found (None if there was none) and, for a
    refusal, its kind and the reason shown to the reflection LM and written to the history."""

    model_config = ConfigDict(frozen=True)

    prompt: str | None
    rejection: RejectionKind | None = None
    reason: str | None = None


def check_proposal(
    reply: str,
    finish_reason: str | None,
    *,
    parents: Sequence[str],
    known: Mapping[str, str],
    answers: Sequence[str],
    max_chars: int,
) -> Verdict:
    """Whether a reply holds a usable proposal (`rejection` None) or why not.
    `known` maps normalized prompts already tried to what became of them."""
    prompt = extract_fenced(reply)
    if prompt is None:
        cut = " (the reply was cut off at the token limit)" if finish_reason == "length" else ""
        return Verdict(
            prompt=None,
            rejection=RejectionKind.NO_FENCED_PROMPT,
            reason=f"no complete ``` fenced instruction in the reply{cut}",
        )
    if not prompt:
        return Verdict(
            prompt=None, rejection=RejectionKind.EMPTY, reason="the fenced instruction was empty"
        )
    refusal: tuple[RejectionKind, str] | None = None
    key = normalize(prompt)
    if len(prompt) > max_chars:
        refusal = (
            RejectionKind.TOO_LONG,
            f"too long: {len(prompt)} characters, the limit is {max_chars}",
        )
    elif leaks := leaked_answers(prompt, answers):
        refusal = (
            RejectionKind.LEAK,
            f"it copies the expected answer of a shown example ({', '.join(leaks)})",
        )
    elif any(key == normalize(p) for p in parents):
        refusal = (RejectionKind.UNCHANGED, "it is the same as the instruction it should improve")
    elif key in known:
        refusal = (RejectionKind.REPEAT, f"it repeats an earlier proposal ({known[key]})")
    if refusal is None:
        return Verdict(prompt=prompt)
    return Verdict(prompt=prompt, rejection=refusal[0], reason=refusal[1])
