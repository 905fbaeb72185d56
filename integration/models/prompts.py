"""Seeded prompts (token ids of the 2048-token vocabulary of the seeded checkpoints)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

RANDOM_PROMPT_LENGTHS = [1, 5, 33, 100, 257, 511, 780, 1000]
REPEATED_PROMPT_LENGTHS = [64, 200, 400, 900]  # a repeated 12-token motif: n-gram drafts find matches
# Past the sparse families' top-k (2048), so that their indexer chooses, and shorter, which vLLM prefills densely.
SPARSE_PROMPT_LENGTHS = (2900, 2300, 700, 60)


def make_spec_prompts(seed: int = 0, vocab: int = 2048, count: int = 12) -> list[list[int]]:
    """Each prompt holds every token of the vocabulary once, so the n-gram proposer finds the last
    token somewhere in it at every step and drafts k tokens for every request: the verification
    batches are uniform (1 + k tokens each) and reach forward_mqa. With random prompts most steps
    mix requests with and without drafts, and vLLM sends such batches' drafts to the prefill path."""
    generator = torch.Generator().manual_seed(1000 + seed)
    return [torch.randperm(vocab, generator=generator).tolist() for _ in range(count)]


def make_prompts(seed: int = 0, vocab: int = 2048) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in RANDOM_PROMPT_LENGTHS]
    for n in REPEATED_PROMPT_LENGTHS:
        motif = torch.randint(0, vocab, (12,), generator=generator).tolist()
        prompts.append((motif * (n // 12 + 1))[:n])
    return prompts


def make_sparse_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    """Random prompts of SPARSE_PROMPT_LENGTHS tokens (ids 2 and up: no BOS or EOS)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=generator).tolist() for n in SPARSE_PROMPT_LENGTHS]


def checkpoint_sparse_prompts(model: str | Path, seed: int = 0) -> list[list[int]]:
    """make_sparse_prompts over the vocabulary of the checkpoint at ``model`` (its config.json)."""
    return make_sparse_prompts(json.loads((Path(model) / "config.json").read_text())["vocab_size"], seed)
