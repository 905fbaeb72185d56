"""Probe: what the memory gives a gather of whole KV rows, apart from any attention kernel. The same
torch index_select reads rows of 576 values (1152 bytes bf16, 576 fp8) in cache order, as a random
permutation, and in runs of 16, over bench --token-indexed's 16 x 128 x 16k cache; the ratios to cache
order say what random slots cost the memory itself. Run with PART=script."""

import torch

from mla_backend.tools.bench import time_graph

ROWS = 128 * 16384


def measure(name: str, dtype: torch.dtype) -> None:
    cache = torch.randint(0, 100, (ROWS, 576), dtype=dtype, device="cuda")
    out = torch.empty_like(cache)
    order = torch.arange(ROWS, device="cuda")
    runs = (torch.randperm(ROWS // 16, device="cuda")[:, None] * 16 + torch.arange(16, device="cuda")).flatten()
    layouts = {"in order": order, "random": torch.randperm(ROWS, device="cuda"), "runs16": runs}
    us = {k: time_graph([lambda ids=ids: torch.index_select(cache, 0, ids, out=out)]) for k, ids in layouts.items()}
    gbps = {k: 2 * cache.numel() * cache.element_size() / v / 1e3 for k, v in us.items()}
    cells = " | ".join(f"{k} {us[k]:8.1f} us {gbps[k]:6.0f} GB/s x{us[k] / us['in order']:.3f}" for k in us)
    print(f"{name}: {cells}", flush=True)


for name, dtype in (("bf16", torch.int16), ("fp8", torch.uint8)):
    measure(name, dtype)
