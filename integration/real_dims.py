"""Decode speed at DeepSeek-V3's real attention dimensions through vLLM: ours against FLASHMLA and
TRITON_MLA in the same run, and the share of a decode step spent in attention.

    python integration/real_dims.py --heads 128,16 --kv fp8 --out results/real_dims

The model (integration/models/real_dims.py): a few decoder layers at DeepSeek-V3's sizes, with 128
heads or 16 (a GPU's share under TP8), vLLM's dummy weights: speed only, correctness is the other
scripts' job.

Per backend, one engine; for each batch and context, decode tokens/s (mla_backend.tools.demo's
decode_throughput: the time of N new tokens minus that of one, so prefill cancels). The attention
share is LAYERS x the backend's kernel time at that shape (the op benchmark's graph replay, same
process, KV beyond L2) over the decode step time (batch / tokens/s).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines.vllm_engine import release_engine  # noqa: E402
from integration.engines.vllm_spec import EngineSpec, engine_kwargs  # noqa: E402
from integration.models.real_dims import LAYERS, REAL_DIMS, save_config  # noqa: E402

BATCHES = (1, 32, 128)
CONTEXTS = (4096, 16384)
NEW_TOKENS = 64
BACKENDS = ("CUSTOM", "FLASHMLA", "TRITON_MLA")
KERNEL_NAMES = {"CUSTOM": "mla_backend", "FLASHMLA": "flashmla", "TRITON_MLA": "triton_mla"}  # tools/peers.py


def engine_rates(backend: str, kv: str, model: str) -> dict[tuple[int, int], float]:
    """Decode tokens/s of one backend at every (batch, context)."""
    from vllm import LLM

    from mla_backend.tools.demo import decode_throughput, random_prompts

    ours = {"backend": "xqa"} if backend == "CUSTOM" else {}  # our kernels, not auto's engine-best route
    spec = EngineSpec(backend, kv, 64, True, max_num_seqs=max(BATCHES), mla_backend=ours)
    kwargs = engine_kwargs(spec, model, max(CONTEXTS) + NEW_TOKENS + 64, memory_fraction=0.6)
    rates = {}
    try:
        llm = LLM(**kwargs, load_format="dummy")
        for batch in BATCHES:
            for context in CONTEXTS:
                prompts = random_prompts(batch, context, REAL_DIMS["vocab_size"])
                rates[batch, context] = decode_throughput(llm, prompts, NEW_TOKENS, repeats=1)
                print(
                    f"[real dims] {backend} batch {batch} ctx {context}: {rates[batch, context]:.0f} tok/s", flush=True
                )
        del llm
    finally:
        release_engine()
    return rates


def kernel_us(kv: str, heads: int) -> dict[tuple[str, int, int], float | None]:
    """Attention kernel time per layer call at each shape, ours and the peers (graph replay)."""
    import torch

    from mla_backend.tools.bench import bench_shape
    from mla_backend.vllm.backend import DECODE_WORKSPACE_BYTES

    dtype = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    # The engine's workspace: the split plan is capped by what it gets.
    workspace = torch.empty(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    times = {}
    for batch in BATCHES:
        for context in CONTEXTS:
            for row in bench_shape(dtype, heads, batch, context, 1, workspace):
                times[row.impl, batch, context] = row.us
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", default="128,16")
    parser.add_argument("--kv", default="fp8", choices=["fp8", "auto"])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--out", type=Path, default=Path("results/real_dims"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/mla_backend_models"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    backends, rows = args.backends.split(","), []
    for heads in (int(h) for h in args.heads.split(",")):
        model = save_config(args.model_dir / f"dsv3_real_dims_h{heads}", heads)
        kernels = kernel_us(args.kv, heads)  # first: short, and kept if the engines overrun a time limit
        print(f"[real dims] H{heads} kernel us per layer call: {kernels}", flush=True)
        rates = {backend: engine_rates(backend, args.kv, model) for backend in backends}
        for batch, context in rates[backends[0]]:
            ours = rates["CUSTOM"][batch, context] if "CUSTOM" in rates else float("nan")
            for backend, by_shape in rates.items():
                rate = by_shape[batch, context]
                step_us = batch / rate * 1e6
                attention = kernels.get((KERNEL_NAMES[backend], batch, context))
                share = LAYERS * attention / step_us if attention else None
                rows.append(
                    dict(heads=heads, batch=batch, context=context, backend=backend, tokens_per_s=rate,
                         vs_ours=ours / rate, step_us=step_us, attention_us=attention, attention_share=share)
                )  # fmt: skip
    (args.out / f"real_dims_{args.kv}.json").write_text(json.dumps(rows, indent=1))
    print(f"\n== real dimensions, {LAYERS} layers, kv {args.kv}: decode tok/s (ours / backend), attention share ==")
    for r in rows:
        share = f"{r['attention_share']:.0%}" if r["attention_share"] is not None else "-"
        print(
            f"H{r['heads']:<4} B{r['batch']:<4} ctx {r['context']:<6} {r['backend']:11} {r['tokens_per_s']:9.0f} tok/s "
            f"(ours/this {r['vs_ours']:.2f})  step {r['step_us']:8.0f} us  attention {share}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
