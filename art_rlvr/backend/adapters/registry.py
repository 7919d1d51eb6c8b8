"""The adapter registry: one LoRA adapter per trainable model on a shared base model.

A trainee's adapter is trained in place and serves its current step; older steps are loaded
lazily from their checkpoints as extra adapters (`step_adapter`), kept while leased, evicted
least-recently-used beyond a cap.

Checkpoints follow ART's `LocalBackend`, the in-process LoRA backend: every step writes its
adapter weights whatever `save_checkpoint` says (so any step can be served by name, and a run
restarted after a kill finds the step it reached, as `PipelineTrainer`'s saved state expects),
and the optimizer state is written only when the trainer asks for a checkpoint. A resumed run
therefore continues from the newest step's weights with the optimizer state of the newest step
that saved one (stale Adam moments rather than none; logged when they differ). ART's
`TinkerNativeBackend` differs: it resumes from its last full training checkpoint and so loses
the un-saved steps, which would make a restarted `PipelineTrainer` repeat them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import art
import torch
from art.dev.model import LoRAConfig
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file

from art_rlvr.backend.adapters import checkpoints as ckpt
from art_rlvr.backend.adapters.merged import MergedWeights
from art_rlvr.backend.adapters.model_source import resolve_base_model
from art_rlvr.backend.engine.generation import GenerationEngine
from art_rlvr.backend.serving.served import ServedLog
from art_rlvr.backend.serving.server import ModelNotFound
from art_rlvr.core.art_layout import checkpoint_dir, list_steps

log = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.pt"


class LoraSettings(BaseModel):
    """Default LoRA shape; a model's own `lora_config` (ART's dev.LoRAConfig) overrides it."""

    model_config = ConfigDict(frozen=True)

    rank: int = Field(default=16, ge=1, le=1024)
    alpha: int = Field(default=32, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass
class Base:
    """One loaded base model, its tokenizer, its engine and the lock both sides share."""

    name: str
    path: str
    model: Any
    tokenizer: Any
    lock: threading.RLock
    engine: GenerationEngine | None = None
    merged: MergedWeights | None = None  # the engine's folded adapter weights (`serve`)


@dataclass
class Trainee:
    """A trainable model's adapter on its base, its step and its optimizer."""

    model: art.TrainableModel
    base: Base
    adapter: str
    model_dir: Path
    step: int
    optimizer: torch.optim.Optimizer
    step_adapters: OrderedDict[int, str] = field(default_factory=OrderedDict)
    leases: dict[int, int] = field(default_factory=dict)
    tokenizer: Any = None  # renders its conversations (its chat template); None: the base's
    served: ServedLog = field(default_factory=ServedLog)  # what its server routes returned

    def __post_init__(self) -> None:
        self.tokenizer = self.tokenizer or self.base.tokenizer


def load_base(name: str, device: torch.device, dtype: torch.dtype) -> Base:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_base_model(name)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    # transformers types `PreTrainedModel.to` through a decorator whose signature drops `self`
    model = loaded.to(device).eval()  # type: ignore[arg-type]
    for param in model.parameters():
        param.requires_grad_(False)
    log.info("loaded %s (%s) in %.1fs on %s", name, path, time.perf_counter() - started, device)
    return Base(name=name, path=path, model=model, tokenizer=tokenizer, lock=threading.RLock())


def lora_config(model: art.TrainableModel, base: Base, defaults: LoraSettings) -> LoraConfig:
    own: LoRAConfig = model.lora_config or {}
    return LoraConfig(
        r=own.get("rank", defaults.rank),
        lora_alpha=own.get("alpha", defaults.alpha),
        lora_dropout=own.get("dropout", defaults.dropout),
        target_modules=list(own.get("target_modules", defaults.target_modules)),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base.path,
    )


@contextlib.contextmanager
def select(base: Base, adapter: str | None) -> Iterator[None]:
    """Make `adapter` the active one (None: the bare base model) for the enclosed forward."""
    if adapter is None:
        with base.model.disable_adapter():
            yield
    else:
        base.model.set_adapter(adapter)
        yield


@contextlib.contextmanager
def serve(base: Base, adapter: str | None) -> Iterator[None]:
    """`select` for the engine's decoding: the adapter folded into the weights where it can be
    (`merged`), peft's LoRA layers otherwise."""
    with select(base, adapter):
        if adapter is None or base.merged is None:
            yield
        else:
            with base.merged.serving(adapter):
                yield


def exclusive(base: Base) -> contextlib.AbstractContextManager[object]:
    """The model to ourselves: the engine lets running sequences finish and admits none."""
    return base.engine.exclusive() if base.engine is not None else base.lock


def attach(
    model: art.TrainableModel,
    base: Base,
    model_dir: Path,
    *,
    adapter: str,
    lora: LoraSettings,
    seed: int,
    make_engine: Callable[[Base], GenerationEngine],
) -> Trainee:
    """Give `model` its adapter on `base`; resume from its latest checkpoint if any."""
    with base.lock:
        config = lora_config(model, base, lora)
        torch.manual_seed(seed)  # same LoRA init for the same seed
        if isinstance(base.model, PeftModel):
            base.model.add_adapter(adapter, config)
        else:
            base.model = get_peft_model(base.model, config, adapter_name=adapter)
            base.merged = MergedWeights(base.model)
            base.engine = make_engine(base)
        base.model.set_adapter(adapter)
        params = [p for n, p in base.model.named_parameters() if f".{adapter}." in n]
        optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
        trainee = Trainee(model, base, adapter, model_dir, 0, optimizer)
        step = ckpt.latest_step(model_dir)
        if step is None:
            save(trainee, optimizer_state=True)  # step 0, so resumes start identically
        else:
            restore(trainee, step)
        return trainee


def save(trainee: Trainee, *, optimizer_state: bool) -> None:
    """Write the adapter of the current step; the optimizer state too when asked (and then
    only for this step: older optimizer files are removed)."""
    model = trainee.base.model

    def write(folder: Path) -> None:
        state = get_peft_model_state_dict(model, adapter_name=trainee.adapter)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in state.items()},
            folder / "adapter_model.safetensors",
        )
        model.peft_config[trainee.adapter].save_pretrained(str(folder))
        if optimizer_state:
            torch.save(trainee.optimizer.state_dict(), folder / OPTIMIZER_FILE)
        ckpt.write_json_atomic(
            folder / "trainer_state.json", {"step": trainee.step, "optimizer": optimizer_state}
        )

    ckpt.write_checkpoint(trainee.model_dir, trainee.step, write)
    if optimizer_state:
        drop_older_optimizer_states(trainee.model_dir, trainee.step)


def drop_older_optimizer_states(model_dir: Path, newest: int) -> None:
    """Only the newest checkpoint keeps its optimizer state (it is as big as the adapter
    twice over); run again on resume, it finishes a clean-up a kill interrupted."""
    for old in list_steps(model_dir):
        if old < newest:
            (checkpoint_dir(model_dir, old) / OPTIMIZER_FILE).unlink(missing_ok=True)


def optimizer_step(model_dir: Path, upto: int) -> int | None:
    """The newest step at or before `upto` whose checkpoint holds optimizer state."""
    steps = [
        s
        for s in list_steps(model_dir)
        if s <= upto and (checkpoint_dir(model_dir, s) / OPTIMIZER_FILE).is_file()
    ]
    return steps[-1] if steps else None


def restore(trainee: Trainee, step: int) -> None:
    folder = checkpoint_dir(trainee.model_dir, step)
    device = next(trainee.base.model.parameters()).device
    weights = load_file(folder / "adapter_model.safetensors", device=str(device))
    set_peft_model_state_dict(trainee.base.model, weights, adapter_name=trainee.adapter)
    moments = optimizer_step(trainee.model_dir, step)
    if moments is not None:
        path = checkpoint_dir(trainee.model_dir, moments) / OPTIMIZER_FILE
        trainee.optimizer.load_state_dict(torch.load(path, weights_only=True))
        drop_older_optimizer_states(trainee.model_dir, moments)
    if moments is None:
        log.warning(
            "%s resumes at step %d with a fresh optimizer state (no checkpoint holds one)",
            trainee.model.name,
            step,
        )
    elif moments != step:
        log.warning(
            "%s resumes at step %d with the optimizer state of step %d (the last saved checkpoint)",
            trainee.model.name,
            step,
            moments,
        )
    trainee.step = step
    log.info("resumed %s at step %d from %s", trainee.model.name, step, folder)


def advance(trainee: Trainee, *, optimizer_state: bool) -> None:
    """The trained weights become the next step, served at once and written to disk."""
    with exclusive(trainee.base):
        trainee.step += 1
        save(trainee, optimizer_state=optimizer_state)


def step_adapter(trainee: Trainee, step: int, *, max_cached: int) -> str:
    """The adapter name serving `step`: current, cached, or loaded from its checkpoint."""
    if step == trainee.step:
        return trainee.adapter
    if step in trainee.step_adapters:
        trainee.step_adapters.move_to_end(step)
        return trainee.step_adapters[step]
    folder = checkpoint_dir(trainee.model_dir, step)
    if not (folder / "adapter_model.safetensors").is_file():
        raise ModelNotFound(
            f"{trainee.model.name}@{step} has no checkpoint; steps on disk: "
            f"{list_steps(trainee.model_dir)}"
        )
    name = f"{trainee.adapter}_s{step}"
    with exclusive(trainee.base):
        trainee.base.model.load_adapter(str(folder), adapter_name=name, is_trainable=False)
        trainee.base.model.set_adapter(trainee.adapter)
        trainee.step_adapters[step] = name
        while len(trainee.step_adapters) > max_cached:
            victim = next((s for s in trainee.step_adapters if s not in trainee.leases), None)
            if victim is None:
                break
            evicted = trainee.step_adapters.pop(victim)
            trainee.base.model.delete_adapter(evicted)
            if trainee.base.merged is not None:
                trainee.base.merged.forget(evicted)
    return name


@contextlib.contextmanager
def lease(trainee: Trainee, step: int) -> Iterator[None]:
    """Hold `step`'s adapter: it is not evicted nor its checkpoint deleted while held."""
    trainee.leases[step] = trainee.leases.get(step, 0) + 1
    try:
        yield
    finally:
        trainee.leases[step] -= 1
        if not trainee.leases[step]:
            del trainee.leases[step]
