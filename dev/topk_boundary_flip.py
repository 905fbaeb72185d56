"""Probe (CPU, float64): what moves a seeded sparse model's greedy tokens where two correct attention
kernels part at a step whose top-2 gap is wide (GLM-5's 2300-token prompt at step 1: 0.56-0.69 nats).

The zoo's seeded checkpoint runs in transformers in float64 (eager attention), teacher-forced on the
prompt and its float64 greedy tokens (models/prompts.make_sparse_prompts), every attention output rounded
to bf16 as the engines' kernels store it. Two candidates, per step:
- swap: at the step's query row, in one layer, the indexer's k-th kept key dropped for the next-best
  one (the choice a run with other upstream rounding could make where the two scores nearly tie:
  ``margin`` is their difference over the row's largest |score|, ``near`` the keys within
  judges/sparse_check.TIE_RELATIVE of the k-th); ``--swap-rank 0`` drops the best key instead, a
  control that must move the logits;
- rounding: every attention output (every row, every layer) times (1 + 2^-20 e), e Gaussian, before
  its bf16 rounding: another kernel's fp32 summation order, which moves a few outputs by one bf16
  step; DRAWS draws, each a run of two correct kernels' worth of difference.
Each reports the change of the step's top-2 gap (nats) and how often the greedy token changes.

    PYTHONPATH=. python dev/topk_boundary_flip.py --family GLM-5 --prompts 1,2 --steps 4 --draws 16
"""

from __future__ import annotations

import argparse
import importlib
import statistics
from pathlib import Path

import torch

from integration.judges.sparse_check import TIE_RELATIVE
from integration.models.checkpoints import save_sparse_checkpoint
from integration.models.prompts import make_sparse_prompts

ACCUMULATION = 2.0**-20  # relative size of an fp32 summation order's difference, before bf16 rounding


class Hooks:
    """The indexer's top-k (records each layer's last-row scores; swaps one layer's last-row boundary
    pair when asked) and the attention output's bf16 rounding (perturbed when a generator is set)."""

    def __init__(self, swap_rank: int = -1):
        self.swap_layer: int | None = None
        self.swap_rank = swap_rank  # which kept key the swap drops: -1 the k-th (the boundary), 0 the best
        self.scores: dict[int, torch.Tensor] = {}
        self.noise: torch.Generator | None = None

    def topk(self, layer: int, scores: torch.Tensor, k: int) -> torch.Tensor:
        picked = scores.topk(min(k + 1, scores.shape[-1]), dim=-1).indices
        self.scores[layer] = scores[0, -1].clone()
        kept = picked[..., :k].clone()
        if layer == self.swap_layer and picked.shape[-1] > k:
            kept[0, -1, self.swap_rank % k] = picked[0, -1, k]
        return kept.to(torch.int32)

    def round_output(self, out: torch.Tensor) -> torch.Tensor:
        if self.noise is not None:
            out = out * (1 + ACCUMULATION * torch.randn(out.shape, generator=self.noise, dtype=out.dtype))
        return out.to(torch.bfloat16).to(out.dtype)


def install(model, hooks: Hooks) -> None:
    module = importlib.import_module(type(model).__module__)
    indexer = next(getattr(module, n) for n in ("GlmMoeDsaIndexer", "DeepseekV32Indexer") if hasattr(module, n))
    attention = type(model.model.layers[0].self_attn)
    index_forward, attention_forward = indexer.forward, attention.forward

    def scored_topk(self, *args, **kwargs):
        captured = {}
        real = torch.Tensor.topk

        def spy(tensor, k, *a, **kw):  # the indexer's masked scores, as its own top-k reads them
            captured["scores"] = tensor
            return real(tensor, min(k, tensor.shape[-1]), *a, **kw)

        torch.Tensor.topk = spy
        try:
            index_forward(self, *args, **kwargs)
        finally:
            torch.Tensor.topk = real
        return hooks.topk(self.layer_idx, captured["scores"], self.index_topk)

    def rounded_attention(self, *args, **kwargs):
        out, weights, topk = attention_forward(self, *args, **kwargs)
        return hooks.round_output(out), weights, topk

    indexer.forward, attention.forward = scored_topk, rounded_attention


def step_log_probs(model, tokens: list[int], steps: int) -> torch.Tensor:
    """[steps, vocab] log-probabilities of decode steps 0..steps-1 (teacher-forced on ``tokens``)."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, -steps:]
    return torch.log_softmax(logits.double(), dim=-1)


def gap(lp: torch.Tensor) -> torch.Tensor:
    top = lp.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="GLM-5")
    parser.add_argument("--prompts", default="1,2")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--swap-steps", default="1", help="steps whose boundary swaps are measured")
    parser.add_argument("--swap-rank", type=int, default=-1, help="0: drop the best key instead (a control)")
    parser.add_argument("--models", type=Path, default=Path("/tmp/topk_flip_models"))
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    family, path = save_sparse_checkpoint(args.family, args.models)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager").eval()
    hooks = Hooks(args.swap_rank)
    install(model, hooks)
    k, layers = model.config.index_topk, len(model.model.layers)
    prompts = make_sparse_prompts(model.config.vocab_size)
    print(f"{family.name}: {layers} layers, top-k {k}; float64, attention outputs rounded to bf16")
    for p in map(int, args.prompts.split(",")):
        tokens = list(prompts[p])
        for _ in range(args.steps):  # the float64 greedy continuation
            tokens.append(int(step_log_probs(model, tokens, 1)[-1].argmax()))
        base = step_log_probs(model, tokens[:-1], args.steps)
        chosen = torch.tensor(tokens[len(prompts[p]) :])
        assert torch.equal(base.argmax(-1), chosen), "teacher forcing reproduces the greedy tokens"
        draws = []
        for seed in range(args.draws):
            hooks.noise = torch.Generator().manual_seed(seed)
            draws.append(step_log_probs(model, tokens[:-1], args.steps))
        hooks.noise = None
        print(f"prompt {p} ({len(prompts[p])} tokens) | step | top-2 gap | rounding: |d gap| median, max; flips")
        for s in range(args.steps if draws else 0):
            moved = [abs((gap(d[s]) - gap(base[s])).item()) for d in draws]
            flips = sum(int(d[s].argmax() != chosen[s]) for d in draws)
            spread = f"{statistics.median(moved):.3f}, {max(moved):.3f}"
            print(f"  {s} | {gap(base[s]).item():.3f} | {spread}; {flips}/{len(draws)}")
        for s in map(int, args.swap_steps.split(",")):
            prefix = tokens[: len(prompts[p]) + s]
            reference = step_log_probs(model, prefix, 1)[-1]
            for layer in range(layers):
                scores = hooks.scores[layer]
                valid = scores[torch.isfinite(scores)]
                if valid.numel() <= k:
                    print(f"  swap step {s} layer {layer}: keeps all {valid.numel()}")
                    continue
                top, scale = valid.topk(k + 1).values, valid.abs().max()
                margin = ((top[k - 1] - top[k]) / scale).item()
                near = int(((valid - top[k - 1]).abs() <= TIE_RELATIVE * scale).sum()) - 1
                hooks.swap_layer = layer
                swapped = step_log_probs(model, prefix, 1)[-1]
                hooks.swap_layer = None
                hooks.scores[layer] = scores
                moved = (gap(swapped) - gap(reference)).item()
                print(
                    f"  swap step {s} layer {layer}: margin {margin:.1e}, near {near}; max |d logp| "
                    f"{(swapped - reference).abs().max().item():.2e}, d gap {moved:+.2e}"
                )


if __name__ == "__main__":
    main()
