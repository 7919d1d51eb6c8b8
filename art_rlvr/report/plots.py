"""The report's figures: pure functions from metrics records to PNG bytes (None: nothing to
plot). Figures are built with `matplotlib.figure.Figure` and the Agg canvas, never pyplot, so
no global state, no display and no backend selection can leak between reports or tests."""

from __future__ import annotations

import io
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from art_rlvr.rundir.events import EIRoundEvent, EvalEvent, Event, TrainEvent
from art_rlvr.rundir.reader import Proposal

GREEN, RED, GREY, BLUE, ORANGE = "#2e7d32", "#c62828", "#9e9e9e", "#1565c0", "#ef6c00"
EPISODE_PANELS = (
    ("turns", "turns per episode"),
    ("tool_calls", "tool calls per episode"),
    ("tool_errors", "tool errors per episode"),
    ("illegal_actions", "illegal actions per episode"),
)
EI_COUNTERS = (
    "clean_solved",
    "recovered",
    "examples_distilled",
    "examples_from_hints",
    "hints_generated",
    "hints_leak_rejected",
    "hints_dropped",
    "teacher_errors",
)


def _figure(height: float = 3.4) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(9, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(alpha=0.3)
    return fig, ax


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _rendered(fig: Figure | None) -> bytes | None:
    """The PNG of a figure; the `*_figure` functions leave the axes to read (the tests do)."""
    return None if fig is None else _png(fig)


def _step_axis(ax: Axes, xs: Sequence[float]) -> None:
    """Steps and rounds are whole numbers: integer ticks only, and a run with one step (an
    evaluation) gets a readable axis around it instead of ticks from -0.045 to 0.045."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if xs and min(xs) == max(xs):
        ax.set_xlim(min(xs) - 1, max(xs) + 1)
        ax.set_xticks([min(xs)])


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-9 for x, y in zip(a, b, strict=True))


def unit_limits(values: Sequence[float]) -> tuple[float, float]:
    """The y range of a reward / accuracy axis: [0, 1] padded, widened to the data when a
    rollout function's rewards (ART's: -100, 2) fall outside it."""
    low, high = min([0.0, *values]), max([1.0, *values])
    pad = 0.03 * (high - low)
    return low - pad, high + pad


def _number(record: Event, key: str) -> float | None:
    """A field of a typed event, or one of its extras (`train/loss`, a round counter), if it
    is a number (a bool is not)."""
    value: object = getattr(record, key, None)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _series(records: Sequence[Event], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    pairs = [
        (px, py)
        for r in records
        if (px := _number(r, x)) is not None and (py := _number(r, key)) is not None
    ]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def curves(
    train: Sequence[TrainEvent],
    evals: Sequence[EvalEvent],
    ei_rounds: Sequence[EIRoundEvent],
    unit: str,
) -> bytes | None:
    return _rendered(curves_figure(train, evals, ei_rounds, unit))


def curves_figure(
    train: Sequence[TrainEvent],
    evals: Sequence[EvalEvent],
    ei_rounds: Sequence[EIRoundEvent],
    unit: str,
) -> Figure | None:
    """Train reward / accuracy per step and val / test accuracy per evaluation. Evaluations
    keep their order: a GEPA+RL run evaluates twice at one step (before and after a prompt
    change), which shows as a vertical segment; tagged points are labelled with their phase."""
    val = [e for e in evals if e.split == "val"]
    test = [e for e in evals if e.split == "test"]
    if not (train or val or test or ei_rounds):
        return None
    fig, ax = _figure()
    steps: list[float] = []
    xs, reward = _series(train, "reward_mean")
    acc_xs, accuracy = _series(train, "accuracy")
    if xs and acc_xs == xs and _same(reward, accuracy):  # a 0/1 reward: one line, said so
        ax.plot(xs, reward, color=ORANGE, lw=2.5, label="train reward (= accuracy)")
    else:
        if xs:
            ax.plot(xs, reward, color=ORANGE, lw=2.5, label="train reward")
        if acc_xs:
            ax.plot(acc_xs, accuracy, "--", color=BLUE, lw=1.5, label="train accuracy")
    steps += xs + acc_xs
    xs, ys = _series(ei_rounds, "clean_accuracy", "round" if unit == "round" else "step")
    if xs:
        ax.plot(xs, ys, "s--", color=GREY, ms=4, label="EI clean-attempt accuracy")
    steps += xs
    points = val
    if points:
        xs, ys = [e.index for e in points], [e.accuracy for e in points]
        ax.plot(xs, ys, "o-", color=GREEN, lw=2, ms=5, label="val accuracy")
        steps += xs
        seen: dict[float, int] = {}
        for e in points:
            tag = e.tag.lstrip("_")
            if tag:  # several evaluations at one step (phases) are labelled one above the other
                row = seen[e.index] = seen.get(e.index, -1) + 1
                ax.annotate(
                    tag,
                    (e.index, e.accuracy),
                    xytext=(3, 5 + 9 * row),
                    fontsize=7,
                    textcoords="offset points",
                )
    xs, ys = _series(test, "accuracy")
    if xs:
        ax.plot(xs, ys, "*", color=RED, ms=12, label="test accuracy")
    ax.set(xlabel=unit, ylabel="reward / accuracy", ylim=unit_limits(reward))
    _step_axis(ax, steps + xs)
    ax.legend(loc="best", fontsize=8)
    return fig


def group_fractions(train: Sequence[TrainEvent]) -> bytes | None:
    return _rendered(group_fractions_figure(train))


def group_fractions_figure(train: Sequence[TrainEvent]) -> Figure | None:
    """Where the GRPO signal is: only mixed groups have a non-zero advantage."""
    rows = [r for r in train if "frac_mixed" in r.model_fields_set]
    if not rows:
        return None
    fig, ax = _figure(3.0)
    steps = [r.step for r in rows]
    bottom = [0.0] * len(rows)
    for key, colour, label in (
        ("frac_all_correct", GREEN, "all correct"),
        ("frac_mixed", BLUE, "mixed (learning signal)"),
        ("frac_all_wrong", RED, "all wrong"),
    ):
        values = [float(getattr(r, key)) for r in rows]
        ax.bar(steps, values, bottom=bottom, color=colour, label=label, width=0.8)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set(xlabel="step", ylabel="fraction of groups", ylim=(0, 1.02))
    _step_axis(ax, steps)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def tokens(train: Sequence[TrainEvent], evals: Sequence[EvalEvent], unit: str) -> bytes | None:
    return _rendered(tokens_figure(train, evals, unit))


def tokens_figure(
    train: Sequence[TrainEvent], evals: Sequence[EvalEvent], unit: str
) -> Figure | None:
    """Completion length: a sudden change is often the first sign of reward hacking."""
    lines = [("train (sampled)", "-", ORANGE, _series(train, "tokens_per_completion"))]
    for split, style, colour in (("val", "o-", GREEN), ("test", "*", RED)):
        chosen = [e for e in evals if e.split == split]
        lines.append((f"{split} (greedy)", style, colour, _series(chosen, "tokens_per_completion")))
    if not any(xs for *_, (xs, _) in lines):
        return None
    fig, ax = _figure(3.0)
    for label, style, colour, (xs, ys) in lines:
        if xs:
            ax.plot(xs, ys, style, color=colour, label=label, ms=8 if style == "*" else 5)
    ax.set(xlabel=unit, ylabel="tokens per completion")
    ax.set_ylim(bottom=0)
    _step_axis(ax, [x for *_, (xs, _) in lines for x in xs])
    ax.legend(loc="best", fontsize=8)
    return fig


def ei_counters(rounds: Sequence[EIRoundEvent]) -> bytes | None:
    """Per-round counters of expert iteration, as grouped bars (zero counters left out)."""
    keys = [k for k in EI_COUNTERS if any(r.stat(k) for r in rounds)]
    if not rounds or not keys:
        return None
    fig, ax = _figure(3.0)
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        xs = [r.round + (i - (len(keys) - 1) / 2) * width for r in rounds]
        ax.bar(xs, [r.stat(key) for r in rounds], width=width, label=key)
    ax.set(xlabel="EI round", ylabel="count")
    ax.set_xticks(sorted({r.round for r in rounds}))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


def gepa_proposals(proposals: Sequence[Proposal]) -> bytes | None:
    """Each scored proposal: its parent's minibatch mean against its own, accepted in green."""
    scored = [
        (p.accepted, before, after)
        for p in proposals
        if (before := p.score_before) is not None and (after := p.score_after) is not None
    ]
    if not scored:
        return None
    fig, ax = _figure(3.0)
    for n, (accepted, before, after) in enumerate(scored):
        colour = GREEN if accepted else RED
        ax.plot([n, n], [before, after], color=colour, alpha=0.6)
        ax.plot(n, before, "o", color=GREY, ms=4)
        ax.plot(n, after, "^", color=colour, ms=6)
    ax.plot([], [], "o", color=GREY, label="parent (minibatch mean)")
    ax.plot([], [], "^", color=GREEN, label="proposal, accepted")
    ax.plot([], [], "^", color=RED, label="proposal, rejected")
    means = [v for _, before, after in scored for v in (before, after)]
    ax.set(xlabel="scored proposal #", ylabel="minibatch mean reward", ylim=unit_limits(means))
    ax.set_xlim(-0.5, len(scored) - 0.5)
    if len(scored) <= 20:
        ax.set_xticks(range(len(scored)))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best", fontsize=8)
    return _png(fig)


def episodes(
    train: Sequence[TrainEvent], val: Sequence[tuple[int, dict[str, float]]], unit: str
) -> bytes | None:
    """Multi-turn counts per episode: the training batches' means (`<count>_per_episode` in
    metrics.jsonl) and each evaluation's (`val`: (step, means) from its trajectory file). One
    panel per count that some episode reported; None for a single-turn run."""
    panels = []
    for key, title in EPISODE_PANELS:
        name = f"{key}_per_episode"
        xs, ys = _series(train, name)
        points = [(step, means[name]) for step, means in val if name in means]
        if xs or points:
            panels.append((title, (xs, ys), points))
    if not panels:
        return None
    fig = Figure(figsize=(9, 2.6 * ((len(panels) + 1) // 2)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    for n, (title, (xs, ys), points) in enumerate(panels, start=1):
        ax = fig.add_subplot((len(panels) + 1) // 2, 2, n)
        ax.grid(alpha=0.3)
        if xs:
            ax.plot(xs, ys, ".-", color=ORANGE, lw=2, label="train (sampled)")
        if points:
            ax.plot(*zip(*points, strict=True), "o-", color=GREEN, ms=5, label="val (greedy)")
        ax.set(title=title, xlabel=unit)
        ax.set_ylim(bottom=0)
        _step_axis(ax, [*xs, *(step for step, _ in points)])
        ax.legend(loc="best", fontsize=7)
    return _png(fig)


def scenario_accuracy(evals: Sequence[EvalEvent], unit: str) -> bytes | None:
    """A mixture's val accuracy per scenario at each evaluation (`by_scenario`)."""
    val = [e for e in evals if e.split == "val" and e.by_scenario]
    names = sorted({name for e in val for name in e.by_scenario})
    if not names:
        return None
    fig, ax = _figure(3.0)
    for name in names:
        points = [(e.index, e.by_scenario[name]) for e in val if name in e.by_scenario]
        ax.plot(*zip(*points, strict=True), "o-", ms=4, label=name)
    ax.set(xlabel=unit, ylabel="val accuracy", ylim=(-0.03, 1.03))
    _step_axis(ax, [e.index for e in val])
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)
