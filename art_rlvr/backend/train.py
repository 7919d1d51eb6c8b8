"""Policy-gradient and SFT steps over token sequences, independent of any server.

Data first: trajectory groups become `Sample`s (prompt ids, completion ids, sampling logprobs,
advantage), SFT trajectories become `SFTSample`s (ids and a loss mask). Logits are computed only
at the positions that predict completion tokens (`logits_to_keep`), because fp32 logits over the
49k vocabulary at every prompt position would dominate the backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import art
import torch
from openai.types.chat.chat_completion import Choice

LossFn = Literal["cispo", "ppo"]


class TrainingDataError(ValueError):
    """The groups or trajectories handed to `train` cannot be trained on."""


@dataclass(frozen=True)
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float] | None
    advantage: float


@dataclass(frozen=True)
class SFTSample:
    input_ids: list[int]
    loss_mask: list[bool]  # True where the token is an assistant target


@dataclass(frozen=True)
class GroupStats:
    used: int
    skipped: int
    trajectories: int


def group_advantages(rewards: Sequence[float], *, scale: bool) -> list[float] | None:
    """Reward minus the group mean (optionally divided by the std); None if no signal."""
    if any(not math.isfinite(r) for r in rewards):
        raise TrainingDataError(f"non-finite reward in group: {list(rewards)}")
    if len(rewards) < 2:
        return None
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if max(abs(c) for c in centred) < 1e-9:
        return None
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + 1e-6) for c in centred]


def last_choice(trajectory: art.Trajectory) -> tuple[list[dict[str, Any]], Choice]:
    """Split a trajectory into the prompt messages and the final sampled choice."""
    items = list(trajectory.messages_and_choices)
    for index in range(len(items) - 1, -1, -1):
        if isinstance(items[index], Choice):
            prompt = [_as_message(m) for m in items[:index]]
            return prompt, items[index]
    raise TrainingDataError(
        "trajectory has no sampled Choice in messages_and_choices: record the model's "
        "response choice (not a plain dict) so it can be trained on"
    )


def _as_message(item: Any) -> dict[str, Any]:
    if isinstance(item, Choice):
        return {"role": "assistant", "content": item.message.content or ""}
    return dict(item)


def choice_tokens(
    choice: Choice, prompt: list[dict[str, Any]], tokenizer
) -> tuple[list[int], list[int], list[float] | None]:
    """Exact ids and sampling logprobs when the server returned them; else re-tokenise."""
    extra = choice.model_extra or {}
    if "prompt_token_ids" in extra and "token_ids" in extra:
        prompt_ids = [int(t) for t in extra["prompt_token_ids"]]
        completion_ids = [int(t) for t in extra["token_ids"]]
        content = choice.logprobs.content if choice.logprobs else None
        logprobs = (
            [float(t.logprob) for t in content]
            if content and len(content) == len(completion_ids)
            else None
        )
        return prompt_ids, completion_ids, logprobs
    prompt_ids = render_prompt(tokenizer, prompt)
    text = choice.message.content or ""
    completion_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        completion_ids = [*completion_ids, tokenizer.eos_token_id]
    return prompt_ids, completion_ids, None


def render_prompt(tokenizer, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
    """Token ids of the chat prompt, ending with the assistant generation header."""
    rendered = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **template_kwargs
    )
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def samples_from_groups(
    groups: Iterable[art.TrajectoryGroup], tokenizer, *, scale_rewards: bool
) -> tuple[list[Sample], GroupStats]:
    samples: list[Sample] = []
    used = skipped = count = 0
    for group in groups:
        trajectories = list(group.trajectories)
        count += len(trajectories)
        advantages = group_advantages([t.reward for t in trajectories], scale=scale_rewards)
        if advantages is None:
            skipped += 1
            continue
        used += 1
        for trajectory, advantage in zip(trajectories, advantages, strict=True):
            prompt, choice = last_choice(trajectory)
            prompt_ids, completion_ids, logprobs = choice_tokens(choice, prompt, tokenizer)
            if completion_ids:
                samples.append(Sample(prompt_ids, completion_ids, logprobs, advantage))
    return samples, GroupStats(used=used, skipped=skipped, trajectories=count)


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def padded_causal_bias(attention: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask [B, 1, N, N]: causal, pad keys hidden, and every position allowed to
    see itself. With a plain 2D mask a left-pad query sees nothing; SDPA's CUDA backward then
    returns NaN gradients for some batch shapes (1 in 150 random bf16 batches on an H100, 0
    with this mask or eager attention), which stopped a GPU run at a non-finite step."""
    n = attention.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=attention.device).tril()
    allowed = causal[None, None] & attention.bool()[:, None, None, :]
    allowed |= torch.eye(n, dtype=torch.bool, device=attention.device)[None, None]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=attention.device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)


def completion_logprobs(
    model: torch.nn.Module, prompts: list[list[int]], completions: list[list[int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each completion token under `model`: ([B, K], mask [B, K]), right-aligned."""
    weights = model.get_input_embeddings().weight
    ids, attention = _left_pad([p + c for p, c in zip(prompts, completions, strict=True)], pad)
    ids, attention = ids.to(weights.device), attention.to(weights.device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    k = max(len(c) for c in completions)
    logits = model(
        input_ids=ids,
        attention_mask=padded_causal_bias(attention, weights.dtype),
        position_ids=positions,
        logits_to_keep=k + 1,
    ).logits[:, :-1, :]
    targets = ids[:, -k:]
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]
    mask = [[0] * (k - len(c)) + [1] * len(c) for c in completions]
    return logps, torch.tensor(mask, device=weights.device).bool()


def policy_loss(
    new: torch.Tensor,
    old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_fn: LossFn,
    epsilon: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Summed token loss (the caller divides by the batch's token count) and diagnostics."""
    ratio = torch.exp(new - old)
    adv = advantages[:, None].expand_as(new)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    if loss_fn == "cispo":
        per_token = -(clipped.detach() * adv * new)
    else:
        per_token = -torch.minimum(ratio * adv, clipped * adv)
    per_token = per_token * mask
    ratio = ratio.detach()
    clip_frac = ((ratio < 1 - epsilon) | (ratio > 1 + epsilon_high)) & mask
    tokens = mask.sum().clamp(min=1)
    diagnostics = {
        "ratio_mean": float((ratio * mask).sum() / tokens),
        "clip_fraction": float(clip_frac.sum() / tokens),
    }
    return per_token.sum(), diagnostics


def kl_k3(new: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(new || ref), summed over masked tokens."""
    delta = ref - new
    return ((torch.exp(delta) - delta - 1) * mask).sum()


def sft_samples(
    trajectories: Iterable[art.Trajectory], tokenizer, *, assistant_turns: Literal["all", "last"]
) -> list[SFTSample]:
    """Render each conversation; only assistant tokens carry loss."""
    out: list[SFTSample] = []
    for trajectory in trajectories:
        messages = [_as_message(m) for m in trajectory.messages_and_choices]
        assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if not assistant_at:
            raise TrainingDataError("SFT trajectory has no assistant message to learn")
        targets = assistant_at[-1:] if assistant_turns == "last" else assistant_at
        ids: list[int] = []
        mask: list[bool] = []
        for i in targets:
            prefix = render_prompt(tokenizer, messages[:i])
            full = _render_full(tokenizer, messages[: i + 1])
            if full[: len(prefix)] != prefix:
                raise TrainingDataError("chat template is not prefix-stable; cannot mask turns")
            new_prefix = prefix[len(ids) :]
            ids.extend(new_prefix)
            mask.extend([False] * len(new_prefix))
            target = full[len(prefix) :]
            ids.extend(target)
            mask.extend([True] * len(target))
        out.append(SFTSample(ids, mask))
    return out


def _render_full(tokenizer, messages: list[dict[str, Any]]) -> list[int]:
    rendered = tokenizer.apply_chat_template(messages, tokenize=True)
    ids = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    # ChatML appends "<|im_end|>\n"; keep the end token, drop the trailing newline.
    while ids and tokenizer.decode([ids[-1]]).strip() == "" and ids[-1] != tokenizer.eos_token_id:
        ids.pop()
    return ids


def sft_loss(model: torch.nn.Module, batch: list[SFTSample], pad: int) -> tuple[torch.Tensor, int]:
    """Summed next-token loss over assistant tokens, and how many such tokens there were."""
    device = next(model.parameters()).device
    width = max(len(s.input_ids) for s in batch)
    ids = torch.tensor([s.input_ids + [pad] * (width - len(s.input_ids)) for s in batch])
    attention = torch.tensor(
        [[1] * len(s.input_ids) + [0] * (width - len(s.input_ids)) for s in batch]
    )
    labels_mask = torch.tensor([s.loss_mask + [False] * (width - len(s.loss_mask)) for s in batch])
    ids, attention, labels_mask = ids.to(device), attention.to(device), labels_mask.to(device)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1, :]
    targets = ids[:, 1:]
    mask = labels_mask[:, 1:]
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]
    tokens = int(mask.sum())
    return -(logps * mask).sum(), tokens
