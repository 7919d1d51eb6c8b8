"""The one write-ahead journal of paid evaluations (`rundir.journal`): the bytes it appends
(the layout GEPA's and the eval journals already on disk have), each record on disk before
`append` returns, a kill's torn tail dropped, a bad line anywhere else a `StateFileError`
naming file:line with the file left as found, and GEPA's store and reflection replies read
back through it. (The torn-tail shapes: `tests/loops/test_faults.py`; the eval journal end to
end: `tests/eval/test_eval_run.py`.)"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from art_rlvr.core.text import prompt_hash
from art_rlvr.gepa.data import ExampleEval, RolloutTrace
from art_rlvr.gepa.propose import journaled_replies
from art_rlvr.gepa.store import EvalStore
from art_rlvr.llm.client import LLMReply
from art_rlvr.rundir.files import StateFileError
from art_rlvr.rundir.journal import Journal

RECORDS: list[dict[str, object]] = [
    {"type": "eval", "b": 1, "a": [1.5, None, True]},
    {"text": "two\nlines", "unicode": "é ✓"},
    {},
]


@pytest.mark.parametrize("record", RECORDS)
def test_a_record_is_one_line_in_the_layout_on_disk_and_reads_back_equal(
    tmp_path: Path, record: dict[str, object]
) -> None:
    path = tmp_path / "new" / "journal.jsonl"  # the folder is made on the first append
    Journal(path).append(record)
    Journal(path).append(record)
    line = json.dumps(record, sort_keys=True) + "\n"  # what both journals wrote before
    assert path.read_text() == line * 2
    assert Journal(path).load() == [record, record]


def test_each_append_is_fsynced_whole_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At each fsync the file already holds the whole line (flushed), and there is one fsync
    per record: what `append` returns from, a kill cannot take back."""
    path = tmp_path / "journal.jsonl"
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    journal = Journal(path)
    sizes = []
    for record in RECORDS:
        journal.append(record)
        sizes.append(path.stat().st_size)
    assert synced == sizes


def test_no_folder_writes_nothing_and_resumes_nothing() -> None:
    journal = Journal(None)
    journal.append({"a": 1})
    assert journal.load() == []


@pytest.mark.parametrize(
    ("content", "line", "says"),
    [
        ('{"a": 1}\nnot json\n{"b": 2}\n', 2, "not JSON: Expecting value at column 1"),
        ('{"a": 1}\n{"a": 2\n{"b": 2}\n', 2, "not JSON"),  # cut short, then written past
        ('{"a": 1}\n\n{"b": 2}\n', 2, "not JSON"),  # a blank line
        ('[1, 2]\n{"b": 2}\n', 1, "a JSON list, not an object"),
        ('{"a": 1}\n{"b": 2}\n"text"\n', 3, "a JSON str, not an object"),  # whole, so not torn
        ('{"a": 1}\n\x00\x00\n{"b": 2}', 2, "not JSON"),  # the torn tail goes, line 2 stays
    ],
)
def test_a_bad_line_before_the_last_is_an_error_naming_it_and_the_file_is_left_as_found(
    tmp_path: Path, content: str, line: int, says: str
) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(content)
    with pytest.raises(StateFileError) as caught:
        Journal(path).load()
    message = str(caught.value)
    assert message.startswith(f"{path}:{line} is corrupt (") and says in message
    assert f"fix or delete line {line}" in message and "move the file away" in message
    assert path.read_text() == content[: content.rfind("\n") + 1]  # only a torn tail is cut


def test_a_record_its_reader_refuses_is_named_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"scenario_id": "s", "prompt_hash": "h", "inputs": "q", "rollouts": []}\n{}\n')
    with pytest.raises(StateFileError, match=r"journal.jsonl:2 is corrupt \(scenario_id: Field"):
        Journal(path).read(ExampleEval.model_validate)


PROMPT = "Answer with the number."


def example_eval(sid: str) -> ExampleEval:
    rollouts = (RolloutTrace(output="4", reward=1.0, correct=True),) * 2
    return ExampleEval(
        scenario_id=sid, prompt_hash=prompt_hash(PROMPT), inputs=f"in {sid}", rollouts=rollouts
    )


def reflection(key: str, calls: int) -> dict[str, object]:
    reply = LLMReply(text=f"reply {key}", finish_reason="stop", attempts=1, seconds=0.1)
    return {
        "type": "reflection",
        "key": key,
        "reply": reply.model_dump(mode="json"),
        "counters": {"calls": calls},
    }


@pytest.mark.parametrize(
    "tail",
    [
        "",
        '{"type": "eval", "eval": {"scenario_id": "s3"',  # a kill mid-write
        '{"type": "eval", "eval": {}}',  # whole, never acknowledged (no newline)
    ],
)
def test_gepa_resumes_its_evaluations_and_replies_through_the_journal(
    tmp_path: Path, tail: str
) -> None:
    """What was paid for before a kill is read back; what a kill cut never happened."""
    path = tmp_path / "journal.jsonl"
    first = EvalStore(100, Journal(path))
    first.put(example_eval("s1"))
    first.journal.append(reflection("a", 1))
    first.put(example_eval("s2"))
    first.put(example_eval("s2"))  # a repeat is neither journaled nor counted twice
    with path.open("a") as handle:
        handle.write(tail)  # what a kill left
    store = EvalStore(100, Journal(path))
    asked, counters = journaled_replies(Journal(path))
    assert store.spent == 4
    assert [sid for sid in ("s1", "s2", "s3") if store.get(PROMPT, sid)] == ["s1", "s2"]
    assert list(asked) == ["a"] and asked["a"].reply == LLMReply.model_validate(
        reflection("a", 1)["reply"]
    )
    assert counters.snapshot()["calls"] == 1
    assert path.read_text().count("\n") == 3 and path.read_text().endswith("\n")


def evaluations(journal: Journal) -> object:
    return EvalStore(100, journal)


def replies(journal: Journal) -> object:
    return journaled_replies(journal)


@pytest.mark.parametrize(
    ("bad", "reader"),
    [
        ('{"type": "eval", "eval": {"scenario_id": "s3"}}', evaluations),  # the wrong shape
        ('{"type": "reflection", "key": 3}', replies),
        ("not json", evaluations),
        ("not json", replies),
    ],
)
def test_a_gepa_journal_with_a_bad_middle_record_is_refused_not_repaid(
    tmp_path: Path, bad: str, reader: Callable[[Journal], object]
) -> None:
    path = tmp_path / "journal.jsonl"
    store = EvalStore(100, Journal(path))
    store.put(example_eval("s1"))
    with path.open("a") as handle:
        handle.write(bad + "\n")
    store.put(example_eval("s2"))
    with pytest.raises(StateFileError, match=r"journal\.jsonl:2 is corrupt"):
        reader(Journal(path))
