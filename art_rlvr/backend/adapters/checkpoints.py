"""Checkpoints in ART's layout (`art_rlvr.core.art_layout`), written atomically.

A step folder is built under a hidden temporary name, fsynced and renamed, so a process killed
mid-save leaves either the whole checkpoint or none (ART's step discovery ignores hidden names).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from art_rlvr.core.art_layout import checkpoint_dir, list_steps
from art_rlvr.rundir.files import write_json_atomic  # noqa: F401  (torch_backend saves through it)


def latest_step(model_dir: Path) -> int | None:
    steps = list_steps(model_dir)
    return steps[-1] if steps else None


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(model_dir: Path, step: int, write: Callable[[Path], object]) -> Path:
    """Call `write(tmp_folder)` then publish it as step `step`; returns the final folder."""
    final = checkpoint_dir(model_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(".tmp-*"):  # a save a kill interrupted (one writer a model)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{step:04d}-", dir=final.parent))
    try:
        write(tmp)
        _fsync_tree(tmp)
        if final.exists():  # a re-run of the same step replaces it whole
            shutil.rmtree(final)
        tmp.rename(final)
        _fsync_tree(final.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def delete_steps(model_dir: Path, keep: set[int]) -> list[int]:
    removed = [s for s in list_steps(model_dir) if s not in keep]
    for step in removed:
        shutil.rmtree(checkpoint_dir(model_dir, step), ignore_errors=True)
    return removed
