"""`python -m art_rlvr.report runs/<run>`: a self-contained HTML report of a run folder.

Curves (reward, accuracy, group split, completion length; turns, tool calls, tool errors and
illegal actions per episode; a mixture's accuracy per scenario), alarms, the prompt's evolution
as diffs with the scores behind each change, expert-iteration counters and a browsable sample
of trajectories, multi-turn episodes shown whole; works on finished and unfinished runs of
every mode.
"""

from art_rlvr.report.build import write_report

__all__ = ["write_report"]
