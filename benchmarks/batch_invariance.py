"""How much one prompt's next-token logits move with the batch it is computed in.

A seeded request repeats token for token only if its logits repeat bit for bit. The engine
batches whatever requests are in flight, so this prints the largest logit difference of one
prompt computed alone against the same prompt (a) beside 1, 3 or 11 copies of itself (more
rows in every matrix product, no padding) and (b) left-padded by k tokens beside a longer row.
Zero everywhere would mean batch-invariant numerics; anything else means a near-tie token can
flip with the batch a request lands in (the known gap of issue 19, shared with vLLM).

It then asks the same of one linear layer of the model's shapes: is a row's output bit-identical
whatever the row count M of the product and the row's place in it? That separates the part a
row-count rule can fix (the linears) from the part that needs per-row attention.

    uv run python benchmarks/batch_invariance.py [--model embedded:SmolLM2-135M-Instruct]
        [--dtype float32|bfloat16]

`--dtype bfloat16` asks it of bf16 weights (oneDNN's kernels, AMX where the cores have it);
TorchBackend runs fp32 on CPU, where the rules of `art_rlvr/backend/engine/invariant.py` were measured.
"""

from __future__ import annotations

import argparse

import torch

from art_rlvr.backend.adapters.registry import load_base

PROMPT = "What is 17 times 23? Answer with a number only please."


def last_logits(model: torch.nn.Module, rows: list[list[int]], pad_id: int) -> torch.Tensor:
    """The last position's logits of each row, the rows left-padded to one length."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
    return out.logits[:, -1].float()


def linear_rows(
    k: int, n: int, counts: range, dtype: torch.dtype = torch.float32, seed: int = 0
) -> list[tuple[int, int]]:
    """(M, place) pairs where a row's `F.linear` output differs from the same row among 4 rows."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=gen).to(dtype)
    row = torch.randn(k, generator=gen).to(dtype)
    others = torch.randn(max(counts), k, generator=gen).to(dtype)
    ref = torch.nn.functional.linear(torch.cat([row[None], others[:3]]), weight)[0]
    differing = []
    for m in counts:
        for place in sorted({0, m // 2, m - 1}):
            x = others[:m].clone()
            x[place] = row
            if not torch.equal(torch.nn.functional.linear(x, weight)[place], ref):
                differing.append((m, place))
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    base = load_base(args.model, torch.device("cpu"), dtype)
    prompt = base.tokenizer(PROMPT)["input_ids"]
    pad = base.tokenizer.pad_token_id or 0
    alone = last_logits(base.model, [prompt], pad)[0]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
        f"prompt {len(prompt)} tokens"
    )
    print("max |logit - alone|")
    for copies in (1, 3, 11):
        out = last_logits(base.model, [prompt] * (copies + 1), pad)[0]
        print(f"  beside {copies:2d} copies of itself: {(out - alone).abs().max().item():.2e}")
    for k in (0, 1, 4, 7, 8, 16):
        out = last_logits(base.model, [prompt, [1] * (len(prompt) + k)], pad)[0]
        print(f"  left-padded by {k:2d}:            {(out - alone).abs().max().item():.2e}")
    config = base.model.config
    shapes = {
        "q/o": (config.hidden_size, config.hidden_size),
        "k/v": (config.hidden_size, config.num_key_value_heads * config.head_dim),
        "mlp up": (config.hidden_size, config.intermediate_size),
        "mlp down": (config.intermediate_size, config.hidden_size),
        "lm head": (config.hidden_size, config.vocab_size),
    }
    print("linear rows differing from the same row among 4 (M, place):")
    for name, (k, n) in shapes.items():
        small = linear_rows(k, n, range(1, 4), dtype)
        other = [d for d in linear_rows(k, n, range(5, 41), dtype) if d[0] % 4]
        by_four = linear_rows(k, n, range(4, 161, 4), dtype)
        print(f"  {name:8s} M 1-3: {len(small)} of 6; M 5-39 not a multiple of 4: {other[:4]}")
        print(f"  {name:8s} M a multiple of 4 up to 160: {by_four or 'none'}")


if __name__ == "__main__":
    main()
