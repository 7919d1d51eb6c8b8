"""The `Phase` protocol: what every phase of a run (`rl`, `gepa`, `ei`, `eval`) is to the
runner (`loops.runner`), and the `Ledger` through which a phase's state reaches the run folder.

A phase is one driver: `run(run, state) -> state` with its own state model (`state_model`),
its own settings (`RunConfig.rl` / `gepa` / `ei`), the same code whether it is the whole run
(`mode=rl` is the list `rl:24`) or one phase of a list (`phases=gepa,rl:8,ei`). What differs
between the two is said once, in `PhaseRun.alone`: a phase alone evaluates itself as it goes
(`eval_every`, `eval_every_rounds`) and its summary is the run's; in a longer list the runner
evaluates between phases (the curve) and sums the list up.

Resume says one thing, with one tool per kind of work:

- work that changes the model (an RL step, an EI round) is a state snapshot through the
  `Ledger`, in three moves: *stage* the work before it changes the model (the pending batch or
  EI buffer goes into the state), *commit* what the backend returned as soon as it returns,
  *book* the finished work once (its event, whose repeat `append_event` drops, then the state
  without the pending part);
- paid evaluations, which change nothing but cost calls (GEPA's evaluations and reflection
  replies, the eval phase's rollouts), go into the one write-ahead journal
  (`rundir.journal`), a record fsynced as each is paid for, read back instead of paid again.

A kill anywhere is redone from the state and the journals. A journaled phase (`journaled`)
keeps its place in its journal; its decisions are a snapshot of its own (GEPA's `state.json`
in its folder), and in a list the runner keeps its totals in the list's state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from pydantic import BaseModel

from art_rlvr.loops.plan import PhaseKind, PlanEntry

if TYPE_CHECKING:  # light at run time: `run.py` imports the eval phase before ART loads
    from art_rlvr.loops.context import RunContext
    from art_rlvr.loops.state import RunState
    from art_rlvr.rundir.events import EIRoundEvent, TrainEvent

type Summary = dict[str, object]  # what a run's summary.json gets from its phases


@dataclass(frozen=True)
class Ledger[S: BaseModel]:
    """The one way a phase's state reaches the run folder. `save` writes the whole run's
    state with this phase's part replaced (atomically: readers see the old or the new file);
    the three moves below are the order every step that changes the model keeps. (Paid
    evaluations are journaled instead, `rundir.journal`: a snapshot per rollout would rewrite
    the whole state for each.)"""

    ctx: RunContext
    save: Callable[[S], None]

    def stage(self, state: S) -> S:
        """`state` holds the work about to change the model (a pending batch, an EI buffer):
        written before the change, so a resume finds it and redoes or books it."""
        self.save(state)
        return state

    def commit(self, state: S) -> S:
        """`state` holds what the backend returned for the staged work (the step it landed as,
        its metrics): written at once, so a kill before booking loses nothing."""
        self.save(state)
        return state

    def book(self, state: S, event: TrainEvent | EIRoundEvent) -> S:
        """The finished work, once: its event (a repeat after a kill is dropped by
        `append_event`), then `state` without the pending part."""
        self.ctx.files.append_event(event)
        self.save(state)
        return state


@dataclass(frozen=True)
class PhaseRun[S: BaseModel]:
    """What a phase gets from the runner besides its state: where it is in the list, the
    prompt `s` it runs under, the model step it began at, and its ledger."""

    ctx: RunContext
    entry: PlanEntry
    index: int
    alone: bool  # the whole run (a list of one): it evaluates itself; its summary is the run's
    prompt: str | None
    start_step: int
    ei_rounds: int  # the EI rounds of the whole list (for the log's "round r/n")
    ledger: Ledger[S]


class Phase[S: BaseModel](Protocol):
    """One kind of phase: its state model, a fresh state, the run of one list entry, what it
    measured at its end (booked on the curve instead of a greedy evaluation) and, alone, the
    run's summary."""

    kind: ClassVar[PhaseKind]
    state_model: type[S]
    what: str  # its state named in errors: "an RL run's"
    journaled: ClassVar[bool]  # its own journal holds its place: alone, it keeps no state.json

    async def fresh(self, run: PhaseRun[S]) -> S: ...

    def part(self, state: RunState) -> S | None:
        """Its section of a list's state (None: none yet)."""
        ...

    async def run(self, run: PhaseRun[S], state: S) -> S: ...

    def settled(self, state: S) -> S:
        """The state the next phase of its kind starts from: its totals kept, its place
        (a pending item, the rounds done within the phase) cleared."""
        ...

    def measured(self, state: S) -> float | None:
        """The val accuracy the phase measured at its end under `s` (an eval phase), or None."""
        ...

    async def summary(self, run: PhaseRun[S], state: S) -> Summary: ...
