"""The prompt's evolution: each accepted change of the system prompt as a diff, next to the
scores that justified it. A change without its evidence cannot be judged, so the two are never
shown apart."""

from __future__ import annotations

import difflib
import re
from collections import Counter

from art_rlvr.report.markup import details, esc, num, pre, section, table
from art_rlvr.rundir.events import PromptChangeEvent
from art_rlvr.rundir.reader import GepaPhase, Proposal, RunFolder


def _words(text: str) -> list[str]:
    """Words with their trailing whitespace, so a changed phrase is one del / ins pair."""
    return re.findall(r"^\s+|\S+\s*", text)


def word_diff(old: str, new: str) -> str:
    """An inline word-level diff: removed words in <del>, added ones in <ins>, all escaped."""
    a, b = _words(old), _words(new)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(esc("".join(a[i1:i2])))
            continue
        if i2 > i1:
            out.append(f"<del>{esc(''.join(a[i1:i2]))}</del>")
        if j2 > j1:
            out.append(f"<ins>{esc(''.join(b[j1:j2]))}</ins>")
    return f'<div class="diff">{"".join(out)}</div>'


def unified(old: str, new: str, names: tuple[str, str] = ("old", "new")) -> str:
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), *names, lineterm="")
    return pre("\n".join(lines), "udiff")


def diff_block(old: str, new: str, names: tuple[str, str] = ("old", "new")) -> str:
    return word_diff(old, new) + details("unified diff and full texts", unified(old, new, names))


def change_block(change: PromptChangeEvent) -> str:
    """One `prompt_change` record of a GEPA+RL run."""
    head = (
        f"round {esc(change.round)}, step {esc(change.step)}: "
        f"Pareto mean {num(change.old_pareto_mean)} &rarr; "
        f"{num(change.new_pareto_mean)}, val accuracy "
        f"{num(change.old_val_accuracy)} &rarr; {num(change.new_val_accuracy)}"
        f" (origin: {esc(change.origin or '?')})"
    )
    body = diff_block(change.old, change.new)
    return f'<div class="change"><h3>{head}</h3>{body}</div>'


def proposal_block(p: Proposal) -> str:
    """An accepted GEPA proposal against its (first) parent."""
    parent = p.parent_prompts[0] if p.parent_prompts else ""
    parents = ", ".join(f"#{i}" for i in p.parents) or "-"
    head = (
        f"{esc(p.phase)} iteration {p.iteration} ({esc(p.kind)}): candidate "
        f"#{esc(p.candidate if p.candidate is not None else '?')} from {esc(parents)}, minibatch "
        f"{num(p.score_before)} &rarr; {num(p.score_after)}, Pareto mean {num(p.pareto_mean)}, "
        f"{p.metric_calls} metric calls so far"
    )
    return (
        f'<div class="change accepted"><h3>{head}</h3>'
        f"{diff_block(parent, p.prompt or '', ('parent', 'proposal'))}</div>"
    )


def phase_block(phase: GepaPhase) -> str:
    proposals = [p for p in phase.proposals if p.kind in ("reflection", "merge")]
    accepted = [p for p in proposals if p.accepted]
    reasons = Counter(p.reason.split(":")[0][:120] or "-" for p in proposals if not p.accepted)
    other = Counter(p.kind for p in phase.proposals if p.kind not in ("reflection", "merge"))
    head = (
        f"<p><b>{esc(phase.label)}</b>: {len(proposals)} proposal(s), {len(accepted)} accepted"
        + "".join(f", {n} {esc(kind)}" for kind, n in sorted(other.items()))
        + (f"; stopped: {esc(phase.stop_reason)}" if phase.stop_reason else "")
        + "</p>"
    )
    rejected = (
        details(
            f"why {sum(reasons.values())} proposal(s) were rejected",
            table(["reason", "count"], reasons.most_common()),
        )
        if reasons
        else ""
    )
    return head + "".join(proposal_block(p) for p in accepted) + rejected


def fixed_prompt(run: RunFolder, system: str | None) -> str:
    if system is None:
        return "<p>No system prompt recorded.</p>"
    return f"<p>The system prompt stayed fixed in this {esc(run.mode)} run:</p>{pre(system)}"


def prompt_section(run: RunFolder, system: str | None) -> str:
    """Prompt changes (GEPA+RL), GEPA's accepted proposals per phase, or the fixed prompt."""
    parts: list[str] = []
    changes = run.prompt_changes
    if changes:
        parts.append(f"<p>{len(changes)} accepted change(s) of the system prompt s:</p>")
        parts += [change_block(c) for c in changes]
    elif run.mode in ("gepa_rl", "gepa_rl_ei"):
        final = (run.summary and run.summary.final_prompt) or (run.state or {}).get("prompt")
        parts.append("<p>s never changed: no GEPA candidate beat it on the Pareto set.</p>")
        if final:
            parts.append(pre(str(final)))
    summary = run.summary
    seed, best = (summary.seed_prompt, summary.best_prompt) if summary else (None, None)
    if run.mode == "gepa" and summary is not None and seed and best:
        scores = (
            f"val accuracy {num(summary.val_accuracy_before)} &rarr; "
            f"{num(summary.val_accuracy_after)}"
        )
        if seed == best:
            parts.append(f"<h3>GEPA kept the seed prompt ({scores})</h3>{pre(str(seed))}")
        else:
            parts.append(
                f"<h3>seed &rarr; best prompt: {scores}</h3>"
                + diff_block(str(seed), str(best), ("seed", "best"))
            )
    for phase in run.gepa:
        parts.append(phase_block(phase))
    if not parts:
        parts.append(fixed_prompt(run, system))
    return section("prompts", "Prompt evolution", "".join(parts))
