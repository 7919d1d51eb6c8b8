"""TorchBackend: an ART backend that samples and trains a transformers model in-process.

It satisfies ART 0.5.23's `Backend` protocol, so `await model.register(TorchBackend())`,
`model.openai_client()`, `backend.train(...)` and `model.train_sft(...)` work unchanged.
One base model is loaded per `base_model`; each trainable model gets its own LoRA adapter on
it (`adapters`). The adapter of the current step is served as `name@step`; older steps are
loaded lazily from their checkpoints when asked for by name (or held with
`exact_adapter_lease`). The optimizer steps themselves are in `steps`, the token data in `train`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import secrets
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import art
import torch
import uvicorn
from art import dev
from art.adapter_leases import pin_inference_target, pinned_inference_name, pinned_inference_step
from art.serving_capabilities import ServingCapabilities

from art_rlvr.backend.adapters import checkpoints as ckpt
from art_rlvr.backend.adapters import registry as A
from art_rlvr.backend.adapters.model_source import DEFAULT_BASE_MODEL
from art_rlvr.backend.adapters.registry import Base as _Base
from art_rlvr.backend.adapters.registry import LoraSettings, Trainee
from art_rlvr.backend.art_options import warn_unknown
from art_rlvr.backend.chat.render import longest_token_chars, render_ids, text_content
from art_rlvr.backend.chat.templates import model_tokenizer
from art_rlvr.backend.engine.generation import (
    Completion,
    GenerationEngine,
    SamplingParams,
    TokenEvent,
)
from art_rlvr.backend.runtime import spin
from art_rlvr.backend.runtime.malloc import pin_malloc_mmap_threshold, release_free_memory
from art_rlvr.backend.runtime.threads import OwnThreads, in_threads, usable_cores
from art_rlvr.backend.serving.served import ServedLog
from art_rlvr.backend.serving.server import (
    ModelNotFound,
    Route,
    ServerThread,
    build_app,
    close_app,
    prompt_chars_bound,
    serve,
    server_config,
)
from art_rlvr.backend.training import steps as S
from art_rlvr.backend.training import train as T
from art_rlvr.core.types import Loss

__all__ = ["LoraSettings", "TorchBackend"]

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 120.0  # for torch threads that cancelled callers left running (model loads)


SERVING = ServingCapabilities(
    runtime="openai_compatible", protocol_version=0, policy_token_spans=True
)


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
        batch_invariant: bool | None = None,
        fold_adapters: bool = True,
        threads: int | None = None,
    ) -> None:
        if threads is not None and (type(threads) is not int or threads < 1):
            raise ValueError(f"threads must be a whole number >= 1, got {threads!r}")
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
        # None: on CPU, where it makes seeded runs repeat (engine/invariant.py); False: faster
        self.batch_invariant = batch_invariant
        # decode an adapter folded into a copy of its weights (adapters/merged.py): a GRPO step's
        # decoding 1.15x faster than through peft's LoRA layers, the same tokens to rounding
        self.fold_adapters = fold_adapters
        # the trainer's thread count and the most the engines use: by default the process's,
        # read before any engine sets its own (torch hands the last count set to new threads);
        # fewer where processes share the cores (each its share: no waits at another's barriers)
        self.threads = threads or usable_cores()
        self._bases: dict[str, _Base] = {}
        self._trainees: dict[str, Trainee] = {}
        self._api_key = self.new_api_key()
        self._server: ServerThread | None = None
        # torch work before an engine exists; `close` waits for what a cancelled caller left
        self._own = OwnThreads()
        self._registry_lock = asyncio.Lock()
        # OpenMP threads spin while our cores are ours, and stop while others want them
        self._spin = spin.acquire() if self.device.type == "cpu" else None

    # ------------------------------------------------------------------ protocol
    async def register(self, model: art.Model) -> None:
        model.base_path = self._path
        model_dir = Path(self._path) / model.project / "models" / model._storage_name()
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "model.json").write_text(json.dumps(model.safe_model_dump(), default=str))
        if not model.trainable:
            return
        if not isinstance(model, art.TrainableModel):
            raise TypeError(
                f"model {model.name!r} says trainable=True but is an art.Model: register an "
                "art.TrainableModel to train it"
            )
        async with self._registry_lock:
            base_name = model.base_model or DEFAULT_BASE_MODEL
            base = self._bases.get(base_name)
            if base is None:
                base = await self._own.run(A.load_base, base_name, self.device, self.dtype)
                self._bases[base_name] = base
            tokenizer = model_tokenizer(base.tokenizer, model, base_name)  # its chat template
            trainee = self._trainees.get(model.name)
            if trainee is not None:  # the same name registered again (a re-run notebook cell)
                trainee.model, trainee.tokenizer = model, tokenizer
                return
            trainee = await self._own.run(
                A.attach,
                model,
                base,
                model_dir,
                adapter=f"m{len(self._trainees)}",
                lora=self.lora,
                seed=self.seed,
                make_engine=self._make_engine,
            )
            trainee.tokenizer = tokenizer
            self._trainees[model.name] = trainee

    async def _prepare_backend_for_training(
        self, model: art.TrainableModel, config: dev.OpenAIServerConfig | None = None
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
        # as ART's LocalBackend does: its client then asks for, and checks, the policy spans
        # the server attaches to every choice (PipelineTrainer's evaluation requires them)
        object.__setattr__(model, "_serving_capabilities", SERVING)
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
        moments = A.optimizer_step(trainee.model_dir, trainee.step)
        optimizer = [] if moments is None else [moments]  # what a resume would load
        keep = {*steps_to_keep, trainee.step, *trainee.leases, *optimizer}
        removed = await asyncio.to_thread(ckpt.delete_steps, trainee.model_dir, keep)
        log.info("deleted checkpoints %s of %s", removed, model.name)

    @contextlib.asynccontextmanager
    async def exact_adapter_lease(
        self, model: art.TrainableModel, step: int
    ) -> AsyncIterator[None]:
        trainee = self._trainee(model)
        await self._torch(trainee.base, self._step_adapter, trainee, step)
        with A.lease(trainee, step):
            async with pin_inference_target(
                model.name, step=step, inference_name=f"{model.name}@{step}"
            ):
                yield

    async def close(self) -> None:
        # engines first: requests still generating fail at once (the server answers them 503),
        # so the server's shutdown has nothing to wait for (a run's Ctrl-C stops in seconds)
        for base in self._bases.values():
            if base.engine is not None:
                await asyncio.to_thread(base.engine.close)
                base.engine = None
        # no thread of ours may still be in torch when the interpreter exits (exit 134)
        if not await asyncio.to_thread(self._own.join, CLOSE_WAIT_S):
            log.warning(
                "close: %d torch threads still running after %g s", self._own.alive, CLOSE_WAIT_S
            )
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
            self._server = None
        if self._spin is not None:
            self._spin = None
            spin.release()

    async def __aenter__(self) -> TorchBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ serving elsewhere
    @staticmethod
    def new_api_key() -> str:
        """A fresh key for the backend's OpenAI-compatible server: its own port's (one each
        backend), or one for `serve_on` that the caller shows its users."""
        return f"art-rlvr-{secrets.token_urlsafe(18)}"

    def serve_on(self, sock: socket.socket, api_key: str) -> None:
        """Serve the models registered here on `sock` (bound and listening wherever the caller
        chose) with the backend's own OpenAI-compatible app: the same routes, request checks
        and `name@step` routing as the port the backend picks for itself. Returns after a
        graceful shutdown (Ctrl-C: uvicorn re-raises the signal), with the backend closed."""
        app = build_app(
            resolve=self._resolve,
            list_models=self._served_names,
            api_key=api_key,
            default_max_tokens=self.default_max_tokens,
        )
        server = uvicorn.Server(server_config(app))
        try:
            asyncio.run(serve(server, [sock]))
        finally:
            asyncio.run(self.close())
            close_app(app)

    # ------------------------------------------------------------------ training
    async def train(
        self,
        model: art.TrainableModel,
        trajectory_groups: Iterable[art.TrajectoryGroup],
        *,
        learning_rate: float = 5e-6,
        loss_fn: Loss = "cispo",
        loss_fn_config: dict | None = None,
        kl_penalty_coef: float = 0.0,
        epsilon: float | None = None,
        epsilon_high: float | None = None,
        scale_rewards: bool = True,
        max_grad_norm: float = 1.0,
        save_checkpoint: bool = True,
        allow_training_without_logprobs: bool = False,
        allow_rerendered_turns: bool = False,
        verbose: bool = False,
        **unknown: object,
    ) -> art.TrainResult:
        """One optimizer step over every sampled assistant turn of the groups.

        Each turn trains on the ids the server sampled: from the Choice, or, where the client
        dropped them (LangChain, the Agents SDK), from the server's record of what it returned.
        A turn it has no record of is an error naming it, unless `allow_rerendered_turns`
        (then it is re-rendered from its text); a Choice with ids but no logprobs is skipped
        unless `allow_training_without_logprobs`, as on ART's LocalBackend. The metrics count
        the turns by source: `turns_served`, `turns_recovered`, `turns_rerendered`,
        `turns_skipped`.

        As on ART's own backends, the step advances and its weights are served whether or not
        `save_checkpoint` is set (ART's `PipelineTrainer` sets it only on evaluation steps);
        it decides only whether the optimizer state is written too (see `adapters`).
        """
        warn_unknown(unknown)
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
        settings = S.RLSettings(
            learning_rate=learning_rate,
            loss_fn=loss_fn,
            epsilon=eps,
            epsilon_high=eps_high,
            kl_coef=kl_penalty_coef,
            max_grad_norm=max_grad_norm,
            microbatch_size=self.microbatch_size,
        )
        policy = T.TurnPolicy(
            served=trainee.served,
            rerender=allow_rerendered_turns,
            without_logprobs=allow_training_without_logprobs,
            model=self._model_inference_name(model),
        )
        samples, stats = T.samples_from_groups(
            groups, trainee.tokenizer, scale_rewards=scale_rewards, policy=policy
        )
        step = functools.partial(S.rl_step, workers=self.threads)
        metrics = await self._torch(trainee.base, step, trainee, samples, settings)
        metrics |= {
            "groups_used": stats.used,
            "groups_skipped": stats.skipped,
            "trajectories": float(stats.trained_trajectories),
            "sequences": float(len(samples)),
            "assistant_turns": float(stats.turns),
            **stats.counts.metrics(),
        }
        await self._torch(
            trainee.base, functools.partial(A.advance, optimizer_state=save_checkpoint), trainee
        )
        await asyncio.to_thread(release_free_memory)
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
        samples, counts = T.sft_samples(
            trajectories,
            trainee.tokenizer,
            assistant_turns=config.assistant_turns,
            served=trainee.served,
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
            step = functools.partial(S.sft_step, workers=self.threads)
            metrics = await self._torch(
                trainee.base, step, trainee, batch, float(rate), self.microbatch_size
            )
            yield metrics | counts.metrics()  # the step's totals: ART averages over batches
        await self._torch(trainee.base, functools.partial(A.advance, optimizer_state=True), trainee)
        await asyncio.to_thread(release_free_memory)

    async def score_completions(
        self,
        model: art.Model,
        prompts: Sequence[list[dict[str, object]]],
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
        tok = trainee.tokenizer
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        prompt_ids = [
            T.render_prompt(
                tok, [{"role": m["role"], "content": text_content(m.get("content"))} for m in p]
            )
            for p in prompts
        ]
        completion_ids = [tok(c, add_special_tokens=False)["input_ids"] + eos for c in completions]
        return await self._torch(
            trainee.base, S.score, trainee, prompt_ids, completion_ids, self.microbatch_size
        )

    # ------------------------------------------------------------------ internals
    def _trainee(self, model: art.Model) -> Trainee:
        trainee = self._trainees.get(model.name)
        if trainee is None:
            raise RuntimeError(f"model {model.name!r} is not registered with this TorchBackend")
        return trainee

    async def _torch[R](self, base: _Base, work: Callable[..., R], *args: object) -> R:
        """`work(*args)` on the base's engine thread, at the backend's thread count: one thread
        (one OpenMP pool) runs all of the process's torch work, or libgomp throttles every
        wait (see `engine`). Before the engine exists, on a thread of its own."""
        if base.engine is not None:
            return await base.engine.run(work, *args, threads=self.threads)
        return await self._own.run(in_threads, self.threads, work, *args)

    def _disk_step(self, model: art.Model) -> int:
        model_dir = Path(self._path) / model.project / "models" / model._storage_name()
        return ckpt.latest_step(model_dir) or 0

    def _make_engine(self, base: _Base) -> GenerationEngine:
        return GenerationEngine(
            base.model,
            base.tokenizer,
            model_lock=base.lock,
            select_adapter=(
                (lambda name: A.serve(base, name))
                if self.fold_adapters
                else (lambda name: A.select(base, name))
            ),
            max_batch_rows=self.max_batch_rows,
            seed=self.seed,
            max_context=self.max_context,
            batch_invariant=self.batch_invariant,
            max_threads=self.threads,
        )

    def _step_adapter(self, trainee: Trainee, step: int) -> str:
        return A.step_adapter(trainee, step, max_cached=self.max_step_adapters)

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
            return self._route(
                trainee.base,
                trainee.tokenizer,
                lambda: self._step_adapter(trainee, step),
                trainee.served,
                policy=f"{model_name}@{step}",
            )
        if name in self._bases:
            base = self._bases[name]  # the weights every trainee starts from: policy 0
            return self._route(base, base.tokenizer, lambda: None, policy=f"{name}@0")
        raise ModelNotFound(f"model {name!r} is not served here; available: {self._served_names()}")

    def _route(
        self,
        base: _Base,
        tokenizer: Any,
        adapter_for: Callable[[], str | None],
        served: ServedLog | None = None,
        policy: str | None = None,
    ) -> Route:
        engine = base.engine
        assert engine is not None

        def render(
            messages: list[dict[str, object]],
            tools: list[dict[str, object]] | None,
            kwargs: dict[str, Any],  # template variables, of any type the template reads
        ) -> list[int]:
            return render_ids(tokenizer, messages, tools, **kwargs)

        async def generate(prompt: list[int], params: SamplingParams, n: int) -> list[Completion]:
            adapter = await self._own.run(adapter_for)
            return await engine.generate(prompt, params, n=n, adapter=adapter)

        async def stream(
            prompt: list[int], params: SamplingParams, n: int
        ) -> AsyncGenerator[TokenEvent | list[Completion], None]:
            adapter = await self._own.run(adapter_for)
            async for item in engine.stream(prompt, params, n=n, adapter=adapter):
                yield item

        return Route(
            render=render,
            generate=generate,
            stream=stream,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            decode_token=lambda t: tokenizer.decode([t]),
            served=served,
            policy=policy,
            max_prompt_chars=prompt_chars_bound(engine.max_context, longest_token_chars(tokenizer)),
        )
