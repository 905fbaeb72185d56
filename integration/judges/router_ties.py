"""Greedy tokens that part at a near tie of an MoE router, found by replaying the model in float64.

The tie rule (judges/tokens.py) looks for near ties in the logits only. A model whose layers route
over experts has a second place where two correct backends part: the router's top-k boundary. Where
the k-th and the (k+1)-th experts' scores lie closer than the model's own bf16 arithmetic moves them,
a difference far below the float64 check's tolerance picks the other expert, and the token that
follows can be one the float64 model ranks nowhere near the top.

``RouterReplay`` replays the seeded checkpoint on the CPU along the reference's tokens up to the step
where ours left them, and calls that step a router tie only if all of these hold:
- the last layer's router scores (sigmoid + correction bias, DeepSeek-V3's ``noaux_tc``) at that
  step have a top-k margin below the largest |bf16 - float64| score difference the same checkpoint
  shows along the reference's generated tokens (its own bf16 noise);
- the two tokens, ours and the reference's, are exactly float64's greedy token and the token float64
  gives with the k-th expert swapped for the (k+1)-th, one each.
A wrong token (a corrupted output, a poisoned reference) is neither of these and stays a failure.

Only the last decoder layer may route: its routing of the newest token reaches no later layer and no
cache, so the swap at that token alone is the whole difference (dp_e2e.py's checkpoint: one dense
layer, then one routed over 8 experts).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch


@dataclass(frozen=True)
class Replay:
    greedy: int  # float64's token at the step
    swapped: int  # float64's token with the k-th expert swapped for the (k+1)-th
    margin: float  # k-th minus (k+1)-th router score for choice
    noise: float  # the largest |bf16 - float64| router score along the reference's tokens

    def explains(self, ours: int, ref: int) -> bool:
        return self.margin < self.noise and self.greedy != self.swapped and {ours, ref} == {self.greedy, self.swapped}


class RouterReplay:
    """The checkpoint at ``path`` (a transformers DeepSeek-V3 whose last decoder layer alone routes),
    loaded on the CPU in float64 and bf16 when first needed."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _load(self, dtype: torch.dtype):
        from transformers import DeepseekV3ForCausalLM

        # The experts' loop in plain torch: the grouped-GEMM path takes no float64.
        model = DeepseekV3ForCausalLM.from_pretrained(self.path, dtype=dtype, experts_implementation="eager").eval()
        config = model.config
        if config.first_k_dense_replace != config.num_hidden_layers - 1 or config.n_group != 1:
            raise ValueError(
                f"{self.path}: the replay needs one router group and only the last layer routed "
                f"(first_k_dense_replace {config.first_k_dense_replace} of {config.num_hidden_layers} layers, "
                f"n_group {config.n_group})"
            )
        return model

    @cached_property
    def exact(self):
        return self._load(torch.float64)

    @cached_property
    def bf16(self):
        return self._load(torch.bfloat16)

    @staticmethod
    @contextlib.contextmanager
    def _router_scores(model, captured: list[torch.Tensor]):
        """The last layer's router scores for choice of every position, in float64, into ``captured``."""
        gate = model.model.layers[-1].mlp.gate

        def capture(_module, args):
            hidden = args[0].reshape(-1, args[0].shape[-1]).double()
            logits = torch.nn.functional.linear(hidden, gate.weight.double())
            captured.append(logits.sigmoid() + gate.e_score_correction_bias.double())

        handle = gate.register_forward_pre_hook(capture)
        try:
            yield gate
        finally:
            handle.remove()

    def _forward(self, model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every position's logits and router scores."""
        captured: list[torch.Tensor] = []
        with self._router_scores(model, captured), torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        return logits, captured[-1]

    def replay(self, prompt: list[int], ref: list[int], step: int) -> Replay:
        """float64 along ``prompt + ref[:step]``: the greedy token at ``step``, the token with the
        boundary experts swapped, the boundary's margin, and the bf16 noise along all of ``ref``."""
        # One causal pass along all of ref gives every step's logits and scores; ``at`` reads step's.
        whole, at = prompt + ref[:-1], len(prompt) - 1 + step
        logits, scores = self._forward(self.exact, whole)
        k = self.exact.config.num_experts_per_tok
        order = scores[at].argsort(descending=True)
        margin = (scores[at, order[k - 1]] - scores[at, order[k]]).item()
        gate = self.exact.model.layers[-1].mlp.gate
        bias = gate.e_score_correction_bias
        saved = bias.clone()
        # The (k+1)-th expert past the k-th (by more than float32 rounding: the router selects in
        # float32); the chosen set is the same however far past. Selection reads the bias, the weights do not.
        bias[order[k]] += margin + 1e-4
        try:
            with torch.no_grad():
                swapped_logits = self.exact(torch.tensor([whole[: at + 1]])).logits[0, -1]
        finally:
            bias.copy_(saved)
        _, bf16_scores = self._forward(self.bf16, whole)
        generated = slice(len(prompt) - 1, None)
        noise = (scores[generated] - bf16_scores[generated]).abs().max().item()
        return Replay(int(logits[at].argmax()), int(swapped_logits.argmax()), margin, noise)

    def explain(
        self, prompts: list[list[int]], ours: list[list[int]], ref: list[list[int]], failures: list[tuple]
    ) -> tuple[list[tuple], list[str]]:
        """The tie rule's ``failures`` ((prompt, step, first tie) triples) that no router tie explains,
        and a note for each one examined."""
        left, notes = [], []
        for prompt, step, first_tie in failures:
            seen = self.replay(prompts[prompt], ref[prompt], step)
            mine, theirs = ours[prompt][step], ref[prompt][step]
            explained = seen.explains(mine, theirs)
            notes.append(
                f"({prompt}, {step}): ours {mine}, reference {theirs}; float64 {seen.greedy}, swapped {seen.swapped}; "
                f"router margin {seen.margin:.4f} vs bf16 noise {seen.noise:.4f}: "
                + ("a router tie" if explained else "not a router tie")
            )
            if not explained:
                left.append((prompt, step, first_tie))
        return left, notes
