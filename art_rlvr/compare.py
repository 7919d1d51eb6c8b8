"""`python -m art_rlvr.compare runs/*`: the ablation table over finished runs.

One row per ablation (RL-only, GEPA+RL, EI without / with teacher hints, GEPA+RL+EI, ...),
mean ± std over the seeds present: initial and final val accuracy, final test accuracy,
rollouts and training tokens spent, reflection and teacher calls, wall time. An evaluation of
an external model (`mode=eval policy.model=...`) is a row `external: <model>` beside them, with
its pass@k (a column per k any run reports), completion tokens and litellm's cost. Runs without
a summary.json (unfinished) are listed and skipped, never silently dropped.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from art_rlvr.rundir.reader import RunFolderError, number, read_run_folder

ORDER = (
    "baseline (eval)",
    "RL-only (fixed prompt)",
    "GEPA (prompt only)",
    "GEPA+RL",
    "EI (no hints)",
    "EI + teacher hints",
    "RL+EI",
    "GEPA+RL+EI",
)

COLUMNS = (
    ("val before", "val_accuracy_before", "{:.3f}"),
    ("val after", "val_accuracy_after", "{:.3f}"),
    ("test after", "test_accuracy_after", "{:.3f}"),
    ("rollouts", "rollouts", "{:.0f}"),
    ("train tokens", "training_tokens", "{:.0f}"),
    ("reflection calls", "reflection_calls", "{:.0f}"),
    ("teacher calls", "teacher_calls", "{:.0f}"),
    ("eval tokens", "completion_tokens", "{:.0f}"),
    ("cost $", "cost_usd", "{:.3g}"),
    ("wall min", "wall_minutes", "{:.1f}"),
)
EXTERNAL = "external: "


class RunRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: Path
    ablation: str
    scenario: str
    seed: int
    values: dict[str, float | None]


def _section(config: Mapping[str, object], key: str) -> Mapping[str, object]:
    """A nested block of a logged config (`policy`, `ei`); empty if unset."""
    value = config.get(key)
    return value if isinstance(value, Mapping) else {}


def ablation(config: Mapping[str, object]) -> str:
    """The ablation a run belongs to, from its logged config (mode and flags)."""
    mode = config.get("mode", "rl")
    policy = _section(config, "policy").get("model")
    if policy:
        return f"{EXTERNAL}{policy}"
    ei = _section(config, "ei")
    with_ei = mode in ("ei", "gepa_rl_ei") or bool(config.get("enable_expert_iteration"))
    if mode == "eval":
        return "baseline (eval)"
    if mode == "gepa":
        return "GEPA (prompt only)"
    if mode == "ei":
        return "EI + teacher hints" if ei.get("enable_teacher_hints") else "EI (no hints)"
    if mode in ("gepa_rl", "gepa_rl_ei"):
        return "GEPA+RL+EI" if with_ei else "GEPA+RL"
    if mode == "phases":
        return f"phases={config.get('phases')}"
    return "RL+EI" if with_ei else "RL-only (fixed prompt)"


def load_run(path: Path) -> RunRecord | str:
    """The run's row values, or why it is skipped (unfinished, or no readable summary)."""
    try:
        run = read_run_folder(path)
    except RunFolderError as error:
        return str(error)
    summary = run.summary
    if summary is None:
        if (path / "summary.json").is_file():
            return "summary.json is not a run summary"
        return "no summary.json (unfinished run?)"
    values: dict[str, float | None] = {
        key: number(getattr(summary, key, None)) for _, key, _ in COLUMNS if key != "wall_minutes"
    }
    values["wall_minutes"] = summary.wall_seconds / 60 if summary.wall_seconds else None
    values |= {pass_key(k): v for k, v in (summary.pass_at_k or {}).items()}
    return RunRecord(
        path=path,
        ablation=ablation(run.config),
        scenario=summary.scenario,
        seed=summary.seed,
        values=values,
    )


def pass_key(k: int) -> str:
    return f"pass@{k}"


def order(name: str) -> tuple[int, str]:
    """ORDER's rank; external models right after the baseline, by name."""
    if name in ORDER:
        return ORDER.index(name), ""
    return ORDER.index("baseline (eval)"), name


def columns(records: Sequence[RunRecord]) -> list[tuple[str, str, str]]:
    """COLUMNS with a pass@k column, after the test accuracy, for each k any run reports."""
    ks = sorted({int(key[5:]) for r in records for key in r.values if key.startswith("pass@")})
    passes = [(pass_key(k), pass_key(k), "{:.3f}") for k in ks]
    at = [key for _, key, _ in COLUMNS].index("test_accuracy_after") + 1
    return [*COLUMNS[:at], *passes, *COLUMNS[at:]]


def cell(values: Sequence[float | None], fmt: str) -> str:
    """mean ± std over the seeds that have the value; '-' where none has it."""
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    mean = fmt.format(statistics.fmean(present))
    if len(present) < 2:
        return mean
    return f"{mean} ± {fmt.format(statistics.stdev(present))}"


def table(records: Sequence[RunRecord]) -> str:
    """A markdown table, one row per (scenario, ablation), in the order of ORDER."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for record in records:
        groups.setdefault((record.scenario, record.ablation), []).append(record)
    shown = columns(records)
    header = ["scenario", "ablation", "seeds", *[name for name, _, _ in shown]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (scenario, name), rows in sorted(
        groups.items(), key=lambda item: (item[0][0], order(item[0][1]))
    ):
        seeds = ",".join(str(s) for s in sorted({r.seed for r in rows}))
        cells = [cell([r.values.get(key) for r in rows], fmt) for _, key, fmt in shown]
        lines.append("| " + " | ".join([scenario, name, seeds, *cells]) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m art_rlvr.compare RUN_DIR [RUN_DIR ...]", file=sys.stderr)
        return 2
    records, skipped = [], []
    for arg in argv:
        path = Path(arg)
        if not path.is_dir():
            print(f"error: {path} is not a run folder", file=sys.stderr)
            return 2
        record = load_run(path)
        if isinstance(record, str):
            skipped.append((path, record))
        else:
            records.append(record)
    for path, why in skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    if not records:
        print("error: no finished runs to compare", file=sys.stderr)
        return 1
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
