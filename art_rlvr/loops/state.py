"""The state models of a run (pydantic only, light): each phase's own, and the list's.

A list of one keeps its phase's state as `state.json` (`TrainState` for `rl`, `EIState` for
`ei`, the layouts `mode=rl` and `mode=ei` have always written; `gepa` and `eval` keep none,
their journals hold their place). A longer list keeps a `RunState`: its place in the list, the
prompt `s`, the curve, and each kind of phase's state in a section of its own (`rl`, `gepa`,
`ei`). A list's state written by an older art_rlvr (`ScheduleState`, one flat model for every
kind of phase) is read and converted (`run_state_of`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from art_rlvr.ei.data import EIState, RoundBuffer
from art_rlvr.rundir.events import PromptChangeEvent


class StateModel(BaseModel):
    """A state file's model: a phase writes it and reads it back (resume) through the same
    model; a key it does not know is another phase's state, not something to ignore."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class PendingBatch(StateModel):
    """The batch being trained when the state was written (its trajectories are saved as
    `trajectories/train_pending.jsonl`): the step it trains from and its statistics; once the
    backend has returned, also the step it landed as, its training metrics and seconds, so a
    kill while the step is booked loses nothing."""

    from_step: int
    stats: dict[str, float]
    landed_step: int | None = None
    train_metrics: dict[str, float] | None = None
    seconds: float = 0.0


class TrainState(StateModel):
    """The rl phase's state: what RL training books after every step. `evals` is keyed by
    step (an rl phase alone evaluates itself; in a list the runner evaluates)."""

    evals: dict[str, float] = Field(default_factory=dict)
    pending: PendingBatch | None = None
    tokens_trained: int = 0
    # steps booked after a kill that lost their training metrics (`tokens_trained` lacks them)
    recovered_steps: list[int] = Field(default_factory=list)
    rollouts: int = 0
    step_seconds: list[float] = Field(default_factory=list)
    train_rewards: dict[str, float] = Field(default_factory=dict)  # step -> batch reward mean
    alarms: list[dict[str, JsonValue]] = Field(default_factory=list)  # observe.alarms dumps
    early_stop: dict[str, JsonValue] | None = None


class GEPAState(StateModel):
    """The gepa phase's state in a list: the frontier it kept for the next search, every
    change of `s` it made, and what its searches spent (each search journals itself in
    `gepa/round_<r>/`). `search` is the last search's summary, for a gepa phase alone."""

    frontier: list[str] = Field(default_factory=list)
    prompt_changes: list[PromptChangeEvent] = Field(default_factory=list)
    metric_calls: int = 0
    reflection_calls: int = 0
    reflection_errors: int = 0
    search: dict[str, JsonValue] = Field(default_factory=dict, exclude=True)


class EvalState(StateModel):
    """The eval phase's state: none kept (its journal `evals/val_<step>/` is its place);
    `result` is what it measured, for the curve and a summary."""

    result: dict[str, JsonValue] = Field(default_factory=dict, exclude=True)


class CurvePoint(StateModel):
    """A list's val accuracy after a phase (`after` is its label, or "start")."""

    after: str
    step: int
    val: float


class RunState(StateModel):
    """`state.json` of a list of more than one phase: the index of the running phase, the
    model step it began at, the prompt `s` the list started from (the current one is the last
    change GEPA made: `prompt`), the curve, and each kind of phase's own state."""

    version: Literal[2] = 2
    plan: str | None = None  # the list's `phases=` spelling (None: a run from before it)
    phase: int = 0
    start_step: int | None = None  # the model step the running phase began at
    start_prompt: str | None = None
    evals: dict[str, float] = Field(default_factory=dict)  # label -> val accuracy
    curve: list[CurvePoint] = Field(default_factory=list)
    rl: TrainState = Field(default_factory=TrainState)
    gepa: GEPAState = Field(default_factory=GEPAState)
    ei: EIState | None = None

    @property
    def prompt(self) -> str | None:
        changes = self.gepa.prompt_changes
        return changes[-1].new if changes else self.start_prompt


class ScheduleState(TrainState):
    """A list's state.json as art_rlvr wrote it before `RunState` (read, then converted)."""

    phase: int
    prompt: str
    plan: str | None = None
    phase_done: int = 0
    curve: list[CurvePoint] = Field(default_factory=list)
    frontier: list[str] = Field(default_factory=list)
    prompt_changes: list[PromptChangeEvent] = Field(default_factory=list)
    phase_target: int | None = None
    ei_buffer: RoundBuffer | None = None
    ei_totals: dict[str, int] = Field(default_factory=dict)
    teacher_counters: dict[str, JsonValue] | None = None
    gepa_metric_calls: int = 0
    reflection_calls: int = 0
    reflection_errors: int = 0


def from_schedule(old: ScheduleState, *, running_rl: int | None) -> RunState:
    """An older list's state as a `RunState`; `running_rl` is the count of the running phase
    if it is an rl phase (its saved target step minus the count is the step it began at)."""
    train = TrainState.model_validate(old.model_dump(include=set(TrainState.model_fields)))
    ei = EIState(
        fingerprint="",  # an older list kept none: the first EI round records it
        rounds_done=old.phase_done,
        pending=old.ei_buffer,
        pending_step=old.phase_target if old.ei_buffer is not None else None,
        totals={k: float(v) for k, v in old.ei_totals.items()},
        teacher_counters=old.teacher_counters,
    )
    start = old.prompt_changes[0].old if old.prompt_changes else old.prompt
    target = old.phase_target if running_rl is not None else None
    return RunState(
        plan=old.plan,
        phase=old.phase,
        start_step=None if target is None or running_rl is None else target - running_rl,
        start_prompt=start,
        evals=old.evals,
        curve=old.curve,
        rl=train.model_copy(update={"evals": {}}),
        gepa=GEPAState(
            frontier=old.frontier,
            prompt_changes=old.prompt_changes,
            metric_calls=old.gepa_metric_calls,
            reflection_calls=old.reflection_calls,
            reflection_errors=old.reflection_errors,
        ),
        ei=ei,
    )


def is_current(raw: object) -> bool:
    """A list's state.json in today's layout (else an older one, or not a state at all)."""
    return isinstance(raw, dict) and raw.get("version") == 2
