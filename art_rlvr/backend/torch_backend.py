"""TorchBackend: an ART backend that samples and trains a transformers model in-process.

It satisfies ART 0.5.23's `Backend` protocol, so `await model.register(TorchBackend())`,
`model.openai_client()`, `backend.train(...)` and `model.train_sft(...)` work unchanged.
One base model is loaded per `base_model`; each trainable model gets its own LoRA adapter on
it. The adapter of the current step is served as `name@step`; older steps are loaded lazily from
their checkpoints when asked for by name (or held with `exact_adapter_lease`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import math
import sys
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import art
import torch
from art.adapter_leases import pin_inference_target, pinned_inference_name, pinned_inference_step
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file

from art_rlvr.backend import checkpoints as ckpt
from art_rlvr.backend import train as T
from art_rlvr.backend.engine import Completion, GenerationEngine, SamplingParams
from art_rlvr.backend.model_source import DEFAULT_BASE_MODEL, resolve_base_model
from art_rlvr.backend.server import ModelNotFound, Route, ServerThread, build_app, new_api_key

log = logging.getLogger(__name__)

_KNOWN_IGNORED = frozenset(
    {
        "normalize_advantages",
        "adam_params",
        "kl_penalty_reference_step",
        "kl_ref_adapter_path",
        "kl_penalty_source",
        "advantage_balance",
        "importance_sampling_level",
        "max_negative_advantage_importance_sampling_weight",
        "mask_prob_ratio",
        "kimi_k2_tau",
        "precalculate_logprobs",
        "plot_tensors",
        "truncated_importance_sampling",
        "scale_learning_rate_by_reward_std_dev",
        "logprob_calculation_chunk_size",
        "packed_sequence_length",
        "num_trajectories_learning_rate_multiplier_power",
        "optimizer_save_interval",
        "final_training_step",
        "grad_accumulation_sequences",
    }
)


def pin_malloc_mmap_threshold(threshold: int = 64 * 1024) -> bool:
    """Stop glibc from raising its mmap threshold as large tensors are freed.

    By default glibc raises the threshold after each free of an mmapped block, so later
    logits-sized buffers (tens of MB, varying shapes every step) land on the heap and are never
    returned: RSS grew by ~1 GB per training step here. A fixed threshold keeps peak RSS flat.
    """
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(-3, threshold))  # -3 is M_MMAP_THRESHOLD


class LoraSettings(BaseModel):
    """Default LoRA shape; a model's own `lora_config` (ART's dev.LoRAConfig) overrides it."""

    model_config = ConfigDict(frozen=True)

    rank: int = Field(default=16, ge=1, le=1024)
    alpha: int = Field(default=32, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass
class _Base:
    """One loaded base model, its tokenizer, its engine and the lock both sides share."""

    name: str
    path: str
    model: Any
    tokenizer: Any
    lock: threading.RLock
    engine: GenerationEngine | None = None


@dataclass
class _Trainee:
    model: art.TrainableModel
    base: _Base
    adapter: str
    model_dir: Path
    step: int
    optimizer: torch.optim.Optimizer
    step_adapters: OrderedDict[int, str] = field(default_factory=OrderedDict)
    leases: dict[int, int] = field(default_factory=dict)


class TorchBackend:
    """Embedded ART backend: generation server on 127.0.0.1 plus GRPO / SFT with LoRA."""

    def __init__(
        self,
        *,
        path: str | Path = ".art",
        device: str | None = None,
        lora: LoraSettings | None = None,
        seed: int = 0,
        max_batch_rows: int = 64,
        max_context: int = 2048,
        default_max_tokens: int = 256,
        microbatch_size: int = 8,
        max_step_adapters: int = 4,
    ) -> None:
        self._path = str(path)
        pin_malloc_mmap_threshold()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = (
            torch.bfloat16
            if self.device.type == "cuda" and torch.cuda.is_bf16_supported()
            else torch.float32
        )
        self.lora = lora or LoraSettings()
        self.seed = seed
        self.max_batch_rows = max_batch_rows
        self.max_context = max_context
        self.default_max_tokens = default_max_tokens
        self.microbatch_size = microbatch_size
        self.max_step_adapters = max_step_adapters
        self._bases: dict[str, _Base] = {}
        self._trainees: dict[str, _Trainee] = {}
        self._api_key = new_api_key()
        self._server: ServerThread | None = None
        self._registry_lock = asyncio.Lock()

    # ------------------------------------------------------------------ protocol
    async def register(self, model: art.Model) -> None:
        model.base_path = self._path
        model_dir = Path(self._path) / model.project / "models" / model._storage_name()
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "model.json").write_text(json.dumps(model.safe_model_dump(), default=str))
        if not model.trainable:
            return
        async with self._registry_lock:
            base_name = getattr(model, "base_model", None) or DEFAULT_BASE_MODEL
            base = self._bases.get(base_name) or await asyncio.to_thread(self._load_base, base_name)
            self._bases[base_name] = base
            trainee = self._trainees.get(model.name)
            if trainee is not None:  # the same name registered again (a re-run notebook cell)
                trainee.model = model
                return
            self._trainees[model.name] = await asyncio.to_thread(
                self._attach, model, base, model_dir
            )

    async def _prepare_backend_for_training(
        self, model: art.TrainableModel, config: Any = None
    ) -> tuple[str, str]:
        if self._server is None:
            self._server = ServerThread(
                build_app(
                    resolve=self._resolve,
                    list_models=self._served_names,
                    api_key=self._api_key,
                    default_max_tokens=self.default_max_tokens,
                )
            )
            log.info("TorchBackend serving on %s", self._server.base_url)
        return self._server.base_url, self._api_key

    def _model_inference_name(self, model: art.Model, step: int | None = None) -> str:
        if exact := pinned_inference_name(model.name, step):
            return exact
        if not model.trainable:
            return model.inference_model_name or model.name
        if step is None:
            step = pinned_inference_step(model.name)
        if step is None:
            trainee = self._trainees.get(model.name)
            step = trainee.step if trainee else self._disk_step(model)
        return f"{model.name}@{step}"

    async def _get_step(self, model: art.TrainableModel) -> int:
        trainee = self._trainees.get(model.name)
        return trainee.step if trainee else self._disk_step(model)

    async def _delete_checkpoint_files(
        self, model: art.TrainableModel, steps_to_keep: list[int]
    ) -> None:
        trainee = self._trainee(model)
        keep = {*steps_to_keep, trainee.step, *trainee.leases}
        removed = await asyncio.to_thread(ckpt.delete_steps, trainee.model_dir, keep)
        log.info("deleted checkpoints %s of %s", removed, model.name)

    @contextlib.asynccontextmanager
    async def exact_adapter_lease(
        self, model: art.TrainableModel, step: int
    ) -> AsyncIterator[None]:
        trainee = self._trainee(model)
        await asyncio.to_thread(self._step_adapter, trainee, step)
        trainee.leases[step] = trainee.leases.get(step, 0) + 1
        try:
            async with pin_inference_target(
                model.name, step=step, inference_name=f"{model.name}@{step}"
            ):
                yield
        finally:
            trainee.leases[step] -= 1
            if not trainee.leases[step]:
                del trainee.leases[step]

    async def close(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
            self._server = None
        for base in self._bases.values():
            if base.engine is not None:
                await asyncio.to_thread(base.engine.close)
                base.engine = None

    async def __aenter__(self) -> TorchBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ training
    async def train(
        self,
        model: art.TrainableModel,
        trajectory_groups: Iterable[art.TrajectoryGroup],
        *,
        learning_rate: float = 5e-6,
        loss_fn: Literal["cispo", "ppo"] = "cispo",
        loss_fn_config: dict | None = None,
        kl_penalty_coef: float = 0.0,
        epsilon: float | None = None,
        epsilon_high: float | None = None,
        scale_rewards: bool = True,
        max_grad_norm: float = 1.0,
        save_checkpoint: bool = True,
        verbose: bool = False,
        **unknown: Any,
    ) -> art.TrainResult:
        """One optimizer step over the groups' samples; returns ART's `TrainResult`."""
        self._warn_unknown(unknown)
        if loss_fn not in ("cispo", "ppo"):
            raise ValueError(f"loss_fn must be 'cispo' or 'ppo', got {loss_fn!r}")
        if not math.isfinite(learning_rate) or learning_rate <= 0:
            raise ValueError(f"learning_rate must be a positive number, got {learning_rate}")
        trainee = self._trainee(model)
        groups = list(trajectory_groups)
        if not groups:
            raise T.TrainingDataError("train() got no trajectory groups")
        cfg = loss_fn_config or {}
        eps = (
            epsilon if epsilon is not None else cfg.get("epsilon", 0.2 if loss_fn == "ppo" else 1.0)
        )
        eps_high = (
            epsilon_high
            if epsilon_high is not None
            else cfg.get("epsilon_high", eps if loss_fn == "ppo" else 4.0)
        )
        samples, stats = T.samples_from_groups(
            groups, trainee.base.tokenizer, scale_rewards=scale_rewards
        )
        metrics = await asyncio.to_thread(
            self._rl_step,
            trainee,
            samples,
            learning_rate,
            loss_fn,
            eps,
            eps_high,
            kl_penalty_coef,
            max_grad_norm,
        )
        metrics |= {"groups_used": stats.used, "groups_skipped": stats.skipped}
        if save_checkpoint:
            await asyncio.to_thread(self._advance, trainee)
        if verbose:
            log.info("train step %d: %s", trainee.step, metrics)
        return art.TrainResult(step=trainee.step, metrics=metrics)

    async def _train_sft(
        self,
        model: art.TrainableModel,
        trajectories: Iterable[art.Trajectory],
        config: art.TrainSFTConfig,
        dev_config: dict | None = None,
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        trainee = self._trainee(model)
        samples = T.sft_samples(
            trajectories, trainee.base.tokenizer, assistant_turns=config.assistant_turns
        )
        if not samples:
            raise T.TrainingDataError("train_sft() got no trajectories")
        size = 8 if config.batch_size == "auto" else int(config.batch_size)
        batches = [samples[i : i + size] for i in range(0, len(samples), size)]
        rates = (
            config.learning_rate
            if isinstance(config.learning_rate, list)
            else [config.learning_rate] * len(batches)
        )
        if len(rates) != len(batches):
            raise ValueError(f"{len(rates)} learning rates for {len(batches)} SFT batches")
        for batch, rate in zip(batches, rates, strict=True):
            yield await asyncio.to_thread(self._sft_step, trainee, batch, float(rate))
        await asyncio.to_thread(self._advance, trainee)

    async def score_completions(
        self,
        model: art.Model,
        prompts: Sequence[list[dict[str, Any]]],
        completions: Sequence[str],
    ) -> list[float]:
        """Summed log p(completion | prompt) under the model's current weights, per pair.

        Not part of ART's protocol: expert iteration uses it for hint reliance (how much more
        likely a completion is under a hinted prompt than under the clean one). Completions
        are re-tokenised and end with the end-of-turn token, as a sampled reply does.
        """
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        trainee = self._trainee(model)
        return await asyncio.to_thread(self._score, trainee, list(prompts), list(completions))

    # ------------------------------------------------------------------ internals
    def _warn_unknown(self, unknown: dict[str, Any]) -> None:
        ignored = sorted(k for k in unknown if k in _KNOWN_IGNORED)
        strange = sorted(k for k in unknown if k not in _KNOWN_IGNORED)
        if ignored:
            warnings.warn(f"TorchBackend ignores ART options {ignored}", stacklevel=3)
        if strange:
            warnings.warn(f"TorchBackend.train: unknown keyword arguments {strange}", stacklevel=3)

    def _trainee(self, model: art.Model) -> _Trainee:
        trainee = self._trainees.get(model.name)
        if trainee is None:
            raise RuntimeError(f"model {model.name!r} is not registered with this TorchBackend")
        return trainee

    def _disk_step(self, model: art.Model) -> int:
        model_dir = Path(self._path) / model.project / "models" / model._storage_name()
        return ckpt.latest_step(model_dir) or 0

    def _load_base(self, name: str) -> _Base:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_base_model(name)
        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype).to(self.device).eval()
        for param in model.parameters():
            param.requires_grad_(False)
        log.info(
            "loaded %s (%s) in %.1fs on %s", name, path, time.perf_counter() - started, self.device
        )
        return _Base(name=name, path=path, model=model, tokenizer=tokenizer, lock=threading.RLock())

    def _lora_config(self, model: art.TrainableModel, base: _Base) -> LoraConfig:
        own = dict(model.lora_config or {})
        return LoraConfig(
            r=own.get("rank", self.lora.rank),
            lora_alpha=own.get("alpha", self.lora.alpha),
            lora_dropout=own.get("dropout", self.lora.dropout),
            target_modules=list(own.get("target_modules", self.lora.target_modules)),
            task_type="CAUSAL_LM",
            base_model_name_or_path=base.path,
        )

    def _attach(self, model: art.TrainableModel, base: _Base, model_dir: Path) -> _Trainee:
        """Give `model` its adapter on `base`; resume from its latest checkpoint if any."""
        with base.lock:
            adapter = f"m{len(self._trainees)}"
            config = self._lora_config(model, base)
            torch.manual_seed(self.seed)  # same LoRA init for the same seed
            if isinstance(base.model, PeftModel):
                base.model.add_adapter(adapter, config)
            else:
                base.model = get_peft_model(base.model, config, adapter_name=adapter)
                base.engine = GenerationEngine(
                    base.model,
                    base.tokenizer,
                    model_lock=base.lock,
                    select_adapter=lambda name, b=base: self._select(b, name),
                    max_batch_rows=self.max_batch_rows,
                    seed=self.seed,
                    max_context=self.max_context,
                )
            base.model.set_adapter(adapter)
            params = [p for n, p in base.model.named_parameters() if f".{adapter}." in n]
            optimizer = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)
            trainee = _Trainee(model, base, adapter, model_dir, 0, optimizer)
            step = ckpt.latest_step(model_dir)
            if step is None:
                self._save(trainee)  # step 0: the initial adapter, so resumes start identically
            else:
                self._restore(trainee, step)
            return trainee

    @contextlib.contextmanager
    def _select(self, base: _Base, adapter: str | None) -> Iterator[None]:
        if adapter is None:
            with base.model.disable_adapter():
                yield
        else:
            base.model.set_adapter(adapter)
            yield

    def _save(self, trainee: _Trainee) -> None:
        model = trainee.base.model

        def write(folder: Path) -> None:
            state = get_peft_model_state_dict(model, adapter_name=trainee.adapter)
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in state.items()},
                folder / "adapter_model.safetensors",
            )
            model.peft_config[trainee.adapter].save_pretrained(str(folder))
            torch.save(trainee.optimizer.state_dict(), folder / "optimizer.pt")
            ckpt.write_json_atomic(folder / "trainer_state.json", {"step": trainee.step})

        ckpt.write_checkpoint(trainee.model_dir, trainee.step, write)
        for old in ckpt.list_steps(trainee.model_dir):  # optimizer state only for the latest
            if old != trainee.step:
                (ckpt.checkpoint_dir(trainee.model_dir, old) / "optimizer.pt").unlink(
                    missing_ok=True
                )

    def _restore(self, trainee: _Trainee, step: int) -> None:
        folder = ckpt.checkpoint_dir(trainee.model_dir, step)
        weights = load_file(folder / "adapter_model.safetensors", device=str(self.device))
        set_peft_model_state_dict(trainee.base.model, weights, adapter_name=trainee.adapter)
        if (folder / "optimizer.pt").is_file():
            trainee.optimizer.load_state_dict(
                torch.load(folder / "optimizer.pt", weights_only=True)
            )
        trainee.step = step
        log.info("resumed %s at step %d from %s", trainee.model.name, step, folder)

    @staticmethod
    def _exclusive(base: _Base) -> contextlib.AbstractContextManager[Any]:
        """The model to ourselves: the engine lets running sequences finish and admits none."""
        return base.engine.exclusive() if base.engine is not None else base.lock

    def _advance(self, trainee: _Trainee) -> None:
        with self._exclusive(trainee.base):
            trainee.step += 1
            self._save(trainee)

    def _step_adapter(self, trainee: _Trainee, step: int) -> str:
        """The adapter name serving `step`: current, cached, or loaded from its checkpoint."""
        if step == trainee.step:
            return trainee.adapter
        if step in trainee.step_adapters:
            trainee.step_adapters.move_to_end(step)
            return trainee.step_adapters[step]
        folder = ckpt.checkpoint_dir(trainee.model_dir, step)
        if not (folder / "adapter_model.safetensors").is_file():
            raise ModelNotFound(
                f"{trainee.model.name}@{step} has no checkpoint; steps on disk: "
                f"{ckpt.list_steps(trainee.model_dir)}"
            )
        name = f"{trainee.adapter}_s{step}"
        with self._exclusive(trainee.base):
            trainee.base.model.load_adapter(str(folder), adapter_name=name, is_trainable=False)
            trainee.base.model.set_adapter(trainee.adapter)
            trainee.step_adapters[step] = name
            while len(trainee.step_adapters) > self.max_step_adapters:
                victim = next((s for s in trainee.step_adapters if s not in trainee.leases), None)
                if victim is None:
                    break
                trainee.base.model.delete_adapter(trainee.step_adapters.pop(victim))
        return name

    def _served_names(self) -> list[str]:
        names = [f"{t.model.name}@{t.step}" for t in self._trainees.values()]
        return [*names, *self._bases]

    def _resolve(self, name: str) -> Route:
        model_name, _, step_text = name.rpartition("@") if "@" in name else (name, "", "")
        trainee = self._trainees.get(model_name)
        if trainee is not None:
            if step_text and not step_text.isdigit():
                raise ModelNotFound(f"bad step in model name {name!r}")
            step = int(step_text) if step_text else trainee.step
            return self._route(trainee.base, lambda: self._step_adapter(trainee, step))
        if name in self._bases:
            return self._route(self._bases[name], lambda: None)
        raise ModelNotFound(f"model {name!r} is not served here; available: {self._served_names()}")

    def _route(self, base: _Base, adapter_for: Any) -> Route:
        tokenizer = base.tokenizer

        def render(messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> list[int]:
            clean = [
                {"role": m["role"], "content": _text_content(m.get("content"))} for m in messages
            ]
            template_kwargs = {k: v for k, v in kwargs.items() if k != "preserve_thinking"}
            return T.render_prompt(tokenizer, clean, **template_kwargs)

        async def generate(prompt: list[int], params: SamplingParams, n: int) -> list[Completion]:
            adapter = await asyncio.to_thread(adapter_for)
            assert base.engine is not None
            return await base.engine.generate(prompt, params, n=n, adapter=adapter)

        return Route(
            render=render,
            generate=generate,
            decode_token=lambda t: tokenizer.decode([t]),
        )

    def _rl_step(
        self,
        trainee: _Trainee,
        samples: list[T.Sample],
        lr: float,
        loss_fn: T.LossFn,
        eps: float,
        eps_high: float,
        kl_coef: float,
        max_grad_norm: float,
    ) -> dict[str, float]:
        started = time.perf_counter()
        tokens = sum(len(s.completion_ids) for s in samples)
        out = {
            "loss": 0.0,
            "grad_norm": 0.0,
            "tokens": float(tokens),
            "kl": 0.0,
            "ratio_mean": 1.0,
            "clip_fraction": 0.0,
            "trajectories": float(len(samples)),
        }
        if not samples:
            out["seconds"] = time.perf_counter() - started
            return out
        base = trainee.base
        pad = base.tokenizer.pad_token_id or 0
        ratio_sum = clip_sum = 0.0
        with self._exclusive(base):
            base.model.set_adapter(trainee.adapter)
            _set_lr(trainee.optimizer, lr)
            trainee.optimizer.zero_grad(set_to_none=True)
            size = self.microbatch_size
            for start in range(0, len(samples), size):
                chunk = samples[start : start + size]
                prompts = [s.prompt_ids for s in chunk]
                comps = [s.completion_ids for s in chunk]
                new, mask = T.completion_logprobs(base.model, prompts, comps, pad)
                old = _old_logprobs(chunk, new)
                adv = torch.tensor([s.advantage for s in chunk], device=new.device)
                loss, diag = T.policy_loss(
                    new, old, adv, mask, loss_fn=loss_fn, epsilon=eps, epsilon_high=eps_high
                )
                if kl_coef > 0:
                    with torch.no_grad(), base.model.disable_adapter():
                        ref, _ = T.completion_logprobs(base.model, prompts, comps, pad)
                    kl = T.kl_k3(new, ref, mask)
                    loss = loss + kl_coef * kl
                    out["kl"] += float(kl) / tokens
                (loss / tokens).backward()
                out["loss"] += float(loss.detach()) / tokens
                chunk_tokens = float(mask.sum())
                ratio_sum += diag["ratio_mean"] * chunk_tokens
                clip_sum += diag["clip_fraction"] * chunk_tokens
            params = [p for group in trainee.optimizer.param_groups for p in group["params"]]
            norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            if not torch.isfinite(norm):
                trainee.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError("non-finite gradient norm; step not applied")
            trainee.optimizer.step()
            trainee.optimizer.zero_grad(set_to_none=True)
        out |= {
            "grad_norm": float(norm),
            "ratio_mean": ratio_sum / tokens,
            "clip_fraction": clip_sum / tokens,
            "seconds": time.perf_counter() - started,
        }
        return out

    def _score(
        self, trainee: _Trainee, prompts: list[list[dict[str, Any]]], completions: list[str]
    ) -> list[float]:
        base = trainee.base
        tok = base.tokenizer
        pad = tok.pad_token_id or 0
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        prompt_ids = [
            T.render_prompt(
                tok, [{"role": m["role"], "content": _text_content(m.get("content"))} for m in p]
            )
            for p in prompts
        ]
        completion_ids = [tok(c, add_special_tokens=False)["input_ids"] + eos for c in completions]
        out: list[float] = []
        with self._exclusive(base), torch.no_grad():
            base.model.set_adapter(trainee.adapter)
            for start in range(0, len(prompts), self.microbatch_size):
                end = start + self.microbatch_size
                logps, mask = T.completion_logprobs(
                    base.model, prompt_ids[start:end], completion_ids[start:end], pad
                )
                out.extend(float(v) for v in (logps * mask).sum(-1))
        return out

    def _sft_step(self, trainee: _Trainee, batch: list[T.SFTSample], lr: float) -> dict[str, float]:
        started = time.perf_counter()
        base = trainee.base
        pad = base.tokenizer.pad_token_id or 0
        with self._exclusive(base):
            base.model.set_adapter(trainee.adapter)
            _set_lr(trainee.optimizer, lr)
            trainee.optimizer.zero_grad(set_to_none=True)
            total = sum(sum(s.loss_mask) for s in batch)
            loss_sum = 0.0
            for start in range(0, len(batch), self.microbatch_size):
                loss, _ = T.sft_loss(base.model, batch[start : start + self.microbatch_size], pad)
                (loss / max(total, 1)).backward()
                loss_sum += float(loss.detach())
            params = [p for group in trainee.optimizer.param_groups for p in group["params"]]
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            trainee.optimizer.step()
            trainee.optimizer.zero_grad(set_to_none=True)
        return {
            "loss": loss_sum / max(total, 1),
            "grad_norm": float(norm),
            "learning_rate": lr,
            "tokens": float(total),
            "seconds": time.perf_counter() - started,
        }


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _old_logprobs(chunk: list[T.Sample], new: torch.Tensor) -> torch.Tensor:
    """Sampling logprobs right-aligned like `new`; on-policy (detached new) where unknown."""
    old = new.detach().clone()
    k = new.shape[1]
    for row, sample in enumerate(chunk):
        if sample.old_logprobs is not None:
            values = torch.tensor(sample.old_logprobs, device=new.device, dtype=new.dtype)
            old[row, k - len(values) :] = values
    return old


def _text_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise ValueError(f"unsupported message content of type {type(content).__name__}")
