"""`backend=tinker`: ART's `TinkerNativeBackend`, on Thinking Machines' service or on any
Tinker-API engine (`TINKER_BASE_URL`, e.g. a local SkyRL from `art_rlvr.backend.external.skyrl`).

Why the native backend: RL trains on the token ids the engine sampled, and ART 0.5.23's
`TinkerNativeBackend` serves them with every choice (`prompt_token_ids`, `token_ids`), while
its older `art.tinker.TinkerBackend` proxy returns none, so ART's own batch preparation stops at
the first RL step. What the native backend lacks, supervised steps (`model.train_sft`, which
expert iteration distils with), is added here on the same training client with Tinker's
`cross_entropy` loss, tokenized by the same renderer.

The embedded model runs there too: the engine serves it under its own name, this process
registers its tokenizer with tinker-cookbook (which ART's tokenizer loader asks first), and
the run names its renderer (`choose.model_config`). Needs the tinker extra, in an
environment of its own (docs/scaling.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, cast

from art.tinker_native import TinkerNativeBackend

from art_rlvr.backend.adapters.model_source import resolve_base_model

if TYPE_CHECKING:
    import art
    from art import dev
    from art.tinker_native.backend import ModelState
    from art.trajectories import LegacyHistory
    from tinker import Datum, ForwardBackwardOutput
    from tinker_cookbook.renderers import Renderer


def register_embedded_tokenizer(base_model: str) -> None:
    """Make `embedded:<name>` a tokenizer name tinker-cookbook (and so ART) can load."""
    from tinker_cookbook import tokenizer_utils
    from transformers import AutoTokenizer

    if not tokenizer_utils.is_tokenizer_registered(base_model):
        folder = resolve_base_model(base_model)
        tokenizer_utils.register_tokenizer(
            base_model, lambda: AutoTokenizer.from_pretrained(folder)
        )


class TinkerBackend(TinkerNativeBackend):
    """ART's `TinkerNativeBackend` with `model.train_sft` (Tinker's `cross_entropy`), taking
    `scale_rewards` as ART's other backends spell it (the native one: `normalize_advantages`)
    and saving a training checkpoint every step by default, as ART's `LocalBackend` and
    TorchBackend do: a run resumes at its last step, optimizer state included, even after the
    engine restarts (the native default saves sampler weights only)."""

    async def _build_model_state(self, model: art.TrainableModel) -> ModelState:
        """ART's resume, then the resumed step's sampler weights saved again from the new
        training client: a run resumed after its engine restarted samples from weights that
        engine holds (SkyRL samples only from models loaded in its own process; Thinking
        Machines' service from any saved path, where this costs one more save)."""
        state = await super()._build_model_state(model)
        step, run = state.current_step, state.training_client.model_id
        path = state.sampler_checkpoint_paths.get(step, "")
        if step > 0 and not path.startswith(f"tinker://{run}/"):
            response = await self._save_sampler_weights(state.training_client, f"step_{step:06d}")
            state.sampler_checkpoint_paths[step] = response.path
            state.sampler_clients[step] = await state.training_client.create_sampling_client_async(
                model_path=response.path
            )
            self._persist_model_state(model, state)
        return state

    async def train(
        self,
        model: art.TrainableModel,
        trajectory_groups: Iterable[art.TrajectoryGroup],
        **kwargs: Any,  # ART's own keywords, each of its own type, passed on
    ) -> art.TrainResult:
        if (scale := kwargs.pop("scale_rewards", None)) is not None:
            kwargs.setdefault("normalize_advantages", bool(scale))
        kwargs.setdefault("save_checkpoint", True)
        return await super().train(model, trajectory_groups, **kwargs)

    async def _train_sft(
        self,
        model: art.TrainableModel,
        trajectories: Iterable[art.Trajectory],
        config: art.types.TrainSFTConfig,
        dev_config: dev.TrainSFTConfig | None = None,
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        import tinker

        state = self._model_state[self._model_key(model)]
        datums = sft_datums(list(trajectories), state.renderer, config.assistant_turns)
        if not datums:
            raise ValueError("train_sft() got no trajectories with an assistant message")
        size = 8 if config.batch_size == "auto" else int(config.batch_size)
        batches = [datums[i : i + size] for i in range(0, len(datums), size)]
        rates = (
            list(config.learning_rate)
            if isinstance(config.learning_rate, list)
            else [config.learning_rate] * len(batches)
        )
        if len(rates) != len(batches):
            raise ValueError(f"{len(rates)} learning rates for {len(batches)} SFT batches")
        for batch, rate in zip(batches, rates, strict=True):
            weighted, tokens = token_mean(batch)
            forward = await state.training_client.forward_backward_async(weighted, "cross_entropy")
            optim = await state.training_client.optim_step_async(
                tinker.AdamParams(learning_rate=float(rate), beta1=0.9, beta2=0.95, eps=1e-8)
            )
            output = await forward.result_async()
            await optim.result_async()
            yield {"loss": batch_loss(output, weighted), "tokens": tokens, "learning_rate": rate}
        await self._advance(model, state)

    async def _advance(self, model: art.TrainableModel, state: ModelState) -> None:
        """A new step's checkpoint, sampler weights and client, as ART's `train` makes."""
        step = state.current_step + 1
        saved, response = await self._save_checkpoint(state.training_client, f"step_{step:06d}")
        state.training_checkpoint_paths[step] = saved.path
        state.sampler_clients[step] = await state.training_client.create_sampling_client_async(
            model_path=response.path
        )
        state.sampler_checkpoint_paths[step] = response.path
        state.current_step = step
        self._persist_model_state(model, state)


def sft_datums(
    trajectories: list[art.Trajectory], renderer: Renderer, assistant_turns: str
) -> list[Datum]:
    """Each history of each trajectory as one supervised datum: loss on every assistant
    message, or on the last one (ART's `assistant_turns`), rendered by the run's renderer."""
    from art.tinker_native.data import convert_openai_messages_to_renderer_format
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised.data import conversation_to_datum

    which = (
        TrainOnWhat.LAST_ASSISTANT_MESSAGE
        if assistant_turns == "last"
        else TrainOnWhat.ALL_ASSISTANT_MESSAGES
    )
    histories = [
        (history.messages(), history.tools)
        for trajectory in trajectories
        for history in _histories(trajectory)
    ]
    return [
        conversation_to_datum(
            convert_openai_messages_to_renderer_format(  # typed as plain dicts there
                cast("list[dict[str, Any]]", list(messages)),
                cast("list[dict[str, Any]] | None", tools),
                renderer,
            ),
            renderer,
            None,
            which,
            reduction="none",
        )
        for messages, tools in histories
        if any(m.get("role") == "assistant" for m in messages)
    ]


def _histories(trajectory: art.Trajectory) -> list[art.Trajectory | LegacyHistory]:
    return [trajectory, *trajectory.additional_histories]


def token_mean(batch: list[Datum]) -> tuple[list[Datum], float]:
    """The batch's datums with weights summing to one over all its trained tokens: the loss is
    the token mean, as TorchBackend's and TRL's SFT take it."""
    import tinker

    total = sum(float(d.loss_fn_inputs["weights"].to_torch().sum()) for d in batch)
    scale = 1.0 / max(total, 1.0)
    weighted = [
        tinker.Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                **d.loss_fn_inputs,
                "weights": tinker.TensorData.from_torch(
                    d.loss_fn_inputs["weights"].to_torch() * scale
                ),
            },
        )
        for d in batch
    ]
    return weighted, total


def batch_loss(output: ForwardBackwardOutput, batch: list[Datum]) -> float:
    """The token-mean cross-entropy, from the per-token log-probabilities the engine returns
    (SkyRL reports no loss in its metrics)."""
    total = 0.0
    for out, datum in zip(output.loss_fn_outputs, batch, strict=True):
        logprobs = out["logprobs"].to_torch()
        total -= float((logprobs * datum.loss_fn_inputs["weights"].to_torch()).sum())
    return total
