"""ART's folder of a model's checkpoints, `<model_dir>/checkpoints/<step:04d>/`: TorchBackend
and ART's own backends write it, export and serve read it, so it is no one backend's."""

from __future__ import annotations

from pathlib import Path


def checkpoint_dir(model_dir: Path, step: int) -> Path:
    return model_dir / "checkpoints" / f"{step:04d}"


def list_steps(model_dir: Path) -> list[int]:
    """The steps with a checkpoint folder, oldest first (hidden, half-written ones are not)."""
    root = model_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())
