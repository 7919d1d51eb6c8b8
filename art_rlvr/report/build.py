"""Read a run folder, draw its figures, write the page and the PNGs next to it."""

from __future__ import annotations

from pathlib import Path

from art_rlvr.report import plots
from art_rlvr.report.page import document
from art_rlvr.rundir.events import EIRoundEvent, EvalEvent, TrainEvent, episode_means
from art_rlvr.rundir.reader import RunFolder, read_run_folder


def figures(run: RunFolder) -> dict[str, bytes]:
    """Every figure the run has data for, in page order."""
    train, evals = run.events(TrainEvent), run.events(EvalEvent)
    ei_rounds = run.events(EIRoundEvent)
    unit = run.step_unit
    drawn = {
        "curves": plots.curves(train, evals, ei_rounds, unit),
        "groups": plots.group_fractions(train),
        "tokens": plots.tokens(train, evals, unit),
        "episodes": plots.episodes(train, val_episode_means(run), unit),
        "scenarios": plots.scenario_accuracy(evals, unit),
        "ei": plots.ei_counters(ei_rounds),
        "gepa": plots.gepa_proposals([p for phase in run.gepa for p in phase.proposals]),
    }
    return {name: png for name, png in drawn.items() if png is not None}


def val_episode_means(run: RunFolder) -> list[tuple[int, dict[str, float]]]:
    """Each val evaluation's multi-turn means, from its trajectory file (an evaluation's
    metrics line carries accuracy, not episode counts)."""
    files = [f for f in run.trajectory_files if f.kind == "val"]
    means = [
        (f.index, episode_means(t.metrics for t in run.trajectories(f)))
        for f in files
        if f.index is not None
    ]
    return [(step, m) for step, m in means if m]


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write `<out>/index.html` (self-contained) and `<out>/<figure>.png`; default out is
    `<run_dir>/report`. Returns the page's path."""
    run = read_run_folder(run_dir)
    out = out if out is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    images = figures(run)
    for name, png in images.items():
        (out / f"{name}.png").write_bytes(png)
    page = out / "index.html"
    tmp = page.with_name(".index.html.tmp")
    tmp.write_text(document(run, images), encoding="utf-8")
    tmp.replace(page)
    return page
