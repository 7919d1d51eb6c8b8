"""Shared fixtures: one real TorchBackend with the real embedded model, served on loopback."""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path

from cores import worker_threads

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # `import art` below may load weave first
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never reach the hub (only 127.0.0.1)

os.environ.update(worker_threads(os.environ))  # before anything loads torch

import art
import pytest

from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend, load_scenario
from art_rlvr.backend.adapters import registry as A
from art_rlvr.backend.engine.generation import GenerationEngine

_names = itertools.count()


@pytest.fixture(scope="session")
def art_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("art")


@pytest.fixture(scope="session")
async def backend(art_path: Path):
    b = TorchBackend(path=art_path, seed=0)
    yield b
    await b.close()


@pytest.fixture(scope="session")
def scenario():
    return load_scenario("arith", seed=0)


async def new_model(backend: TorchBackend, prefix: str = "m") -> art.TrainableModel:
    """A fresh trainable model (its own LoRA adapter) on the shared base model."""
    model = art.TrainableModel(
        name=f"{prefix}{next(_names)}",
        project="tests",
        run_name=f"{prefix}{next(_names)}",
        base_model=DEFAULT_BASE_MODEL,
    )
    await model.register(backend)
    return model


@pytest.fixture(scope="session")
def make_model(backend: TorchBackend):
    """Factory: `await make_model("prefix")` gives a fresh model with its own adapter."""

    async def make(prefix: str = "m") -> art.TrainableModel:
        return await new_model(backend, prefix)

    return make


@pytest.fixture(scope="session")
def make_engine(backend: TorchBackend):
    """Factory: another GenerationEngine on the shared base model (a model must be registered
    first, e.g. the `model` fixture), with `options` (`fold=False`: adapters decoded through
    peft's LoRA layers, as `TorchBackend(fold_adapters=False)` does); close it after use."""

    return functools.partial(engine_on, backend)


def engine_on(backend: TorchBackend, *, fold: bool = True, **options) -> GenerationEngine:
    """Another GenerationEngine on `backend`'s base model (see `make_engine`)."""
    base = next(iter(backend._bases.values()))
    return GenerationEngine(
        base.model,
        base.tokenizer,
        model_lock=base.lock,
        select_adapter=functools.partial(A.serve if fold else A.select, base),
        **options,
    )


@pytest.fixture(scope="session")
async def model(backend: TorchBackend) -> art.TrainableModel:
    """A shared model that tests must not train."""
    return await new_model(backend, "shared")
