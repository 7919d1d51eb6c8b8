"""A browsable sample of trajectories: the best and worst of every train step, and a few
failures of every evaluation. "Watch your rollouts, don't blindly trust the reward": these are
what a reader opens when a curve looks too good. Plain <details>, so no script is needed.

A multi-turn episode is shown whole: every assistant turn with its tool calls (name and
arguments as sent), each tool's result under the call it answers, the environment's messages
between turns, and the episode's logs (tool errors, a turn cap)."""

from __future__ import annotations

from collections.abc import Sequence

from art_rlvr.report.markup import details, esc, num, pre, section, slug
from art_rlvr.rundir.events import EvalEvent
from art_rlvr.rundir.reader import RunFolder, TrajectoryFile
from art_rlvr.rundir.stored import Message, StoredTrajectory

MAX_TRAIN_FILES = 60  # a long run shows an even spread of its steps, first and last included
MAX_EVAL_FILES = 30
FAILURES_PER_EVAL = 3


def spread(items: Sequence[TrajectoryFile], limit: int) -> list[TrajectoryFile]:
    """At most `limit` items, evenly spaced, always keeping the first and the last."""
    if len(items) <= limit:
        return list(items)
    picks = {round(i * (len(items) - 1) / (limit - 1)) for i in range(limit)}
    return [items[i] for i in sorted(picks)]


def best_and_worst(rows: Sequence[StoredTrajectory]) -> list[tuple[str, StoredTrajectory]]:
    if not rows:
        return []
    best = max(rows, key=lambda t: (t.reward, t.correct))
    worst = min(rows, key=lambda t: (t.reward, t.correct))
    return [("best", best)] if best is worst else [("best", best), ("worst", worst)]


def system_prompt(run: RunFolder) -> str | None:
    """The system prompt the run's first recorded trajectory was rendered with."""
    for f in run.trajectory_files:
        for row in run.trajectories(f)[:1]:
            for message in row.opening:
                if message.role == "system":
                    return message.content
    return None


def message_block(m: Message, role: str | None = None, cls: str = "") -> str:
    head = f'<span class="role">{esc(role or m.role)}</span>'
    body = pre(m.content, cls) if m.content or not m.tool_calls else ""
    calls = "".join(
        f'<pre class="call">&#8594; {esc(c.name)}({esc(c.arguments)})</pre>' for c in m.tool_calls
    )
    return f'<div class="msg">{head}{body}{calls}</div>'


def episode_lines(t: StoredTrajectory) -> list[tuple[str, str, Message]]:
    """(label, css class, message) of each message after the opening: replies (the last one
    is the completion), tool results under the name of the call they answer, and the
    environment's messages. The page and the trajectory browser label turns alike."""
    calls = {c.id: c for m in t.episode for c in m.tool_calls}
    rest = t.episode[len(t.opening) :]
    last = max((i for i, m in enumerate(rest) if m.role == "assistant"), default=-1)
    out, turn = [], 0
    for i, m in enumerate(rest):
        if m.role == "assistant":
            out.append((f"assistant, turn {turn}", "completion" if i == last else "", m))
            turn += 1
        elif m.role == "tool":
            call = calls.get(m.tool_call_id or "")
            out.append((f"tool result: {call.name if call else m.name or '?'}", "tool", m))
        else:
            out.append(("environment" if m.role == "user" else m.role, "env", m))
    return out


def episode_block(t: StoredTrajectory) -> str:
    """The turns after the opening: replies, tool calls, tool results, environment messages."""
    blocks = [
        f'<div class="result">{message_block(m, label, cls)}</div>'
        if cls == "tool"
        else message_block(m, label, cls)
        for label, cls, m in episode_lines(t)
    ]
    return f'<div class="episode">{"".join(blocks)}</div>'


def episode_counts(t: StoredTrajectory) -> str:
    """'3 turns, 2 tool calls, 1 tool error, 1 illegal action' from the episode's metrics (no
    zero counts of errors and illegal actions)."""
    parts = []
    for key, one, many in (
        ("turns", "turn", "turns"),
        ("tool_calls", "tool call", "tool calls"),
        ("tool_errors", "tool error", "tool errors"),
        ("illegal_actions", "illegal action", "illegal actions"),
    ):
        value = t.metrics.get(key)
        if isinstance(value, int | float) and (value or key in ("turns", "tool_calls")):
            parts.append(f"{value:g} {one if value == 1 else many}")
    return ", ".join(parts)


def trajectory_block(t: StoredTrajectory, label: str, id_: str) -> str:
    tokens = t.metrics.get("completion_tokens")
    counts = episode_counts(t) if t.multi_turn else ""
    meta = (
        f"<b>{esc(label)}</b> &middot; scenario <code>{esc(t.scenario_id)}</code> &middot; "
        f"reward {num(t.reward)} &middot; {'correct' if t.correct else 'wrong'}"
        + (f" &middot; {esc(counts)}" if counts else "")
        + (f" &middot; {esc(tokens)} tokens" if tokens is not None else "")
    )
    opening = t.opening
    prompt = "".join(message_block(m) for m in opening)
    body = (
        '<p class="label">episode</p>' + episode_block(t)
        if t.multi_turn
        else '<p class="label">completion</p>' + pre(t.completion, "completion")
    )
    logs = details(f"logs ({len(t.logs)})", pre("\n".join(t.logs))) if t.logs else ""
    metrics = ", ".join(f"{esc(k)}={esc(num(v))}" for k, v in sorted(t.metrics.items()))
    return (
        f'<div class="traj" id="{esc(id_)}"><p class="meta">{meta}</p>'
        + details(f"prompt ({len(opening)} messages)", prompt)
        + body
        + '<p class="label">feedback</p>'
        + pre(t.feedback or "(none)", "feedback")
        + logs
        + f'<p class="small">metrics: {metrics or "-"}</p></div>'
    )


def train_samples(run: RunFolder) -> str:
    files = [f for f in run.trajectory_files if f.kind == "train"]
    if not files:
        return ""
    unit = run.step_unit
    shown = spread(files, MAX_TRAIN_FILES)
    blocks = []
    for f in shown:
        rows = run.trajectories(f)
        picks = best_and_worst(rows)
        if not picks:
            continue
        mean = sum(t.reward for t in rows) / len(rows)
        head = (
            f"{unit} {esc(f.index)} &middot; {len(rows)} rollouts &middot; mean reward "
            f"{num(mean)} &middot; best {num(picks[0][1].reward)} &middot; worst "
            f"{num(picks[-1][1].reward)}"
        )
        body = "".join(
            trajectory_block(t, f"{label} of {unit} {f.index}", f"traj-{slug(f.label)}-{label}")
            for label, t in picks
        )
        blocks.append(details(head, body, cls="step"))
    note = (
        f" ({len(shown)} of {len(files)} shown, evenly spread)" if len(shown) < len(files) else ""
    )
    return f"<h3>Train: best and worst rollout per {unit}{esc(note)}</h3>" + "".join(blocks)


def eval_order(run: RunFolder, f: TrajectoryFile) -> tuple[int, int, str]:
    """Evaluation files in the order they were run (metrics.jsonl), then by step and name."""
    for n, e in enumerate(run.events(EvalEvent)):
        if (e.split, e.index, e.tag.lstrip("_")) == (f.kind, f.index, f.tag):
            return (n, 0, "")
    return (len(run.metrics), f.index if f.index is not None else -1, f.label)


def eval_samples(run: RunFolder) -> str:
    files = sorted(
        (f for f in run.trajectory_files if f.kind in ("val", "test")),
        key=lambda f: eval_order(run, f),
    )
    if not files:
        return ""
    shown = spread(files, MAX_EVAL_FILES)
    blocks = []
    for f in shown:
        rows = run.trajectories(f)
        failures = [t for t in rows if not t.correct][:FAILURES_PER_EVAL]
        correct = sum(t.correct for t in rows)
        where = [f.kind, f"{run.step_unit} {f.index}" if f.index is not None else "", f.tag]
        head = (
            f"{esc(' '.join(w for w in where if w))} &middot; {correct}/{len(rows)} correct "
            f"&middot; {len(failures)} failure(s) shown"
        )
        body = "".join(
            trajectory_block(t, "failure", f"traj-{slug(f.label)}-fail{n}")
            for n, t in enumerate(failures)
        )
        blocks.append(details(head, body or "<p>No failures.</p>", cls="eval"))
    return "<h3>Evaluations: a few failures each</h3>" + "".join(blocks)


def trajectory_section(run: RunFolder) -> str:
    body = train_samples(run) + eval_samples(run)
    if not body:
        body = "<p>No trajectories recorded yet.</p>"
    return section("trajectories", "Trajectories", body)
