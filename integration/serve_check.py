"""Serving check of the vLLM plugin on a GPU: ``vllm serve`` with ``--attention-backend CUSTOM`` on a
seeded DeepSeek-V3 (or, with ``--family``, a sparse family of the zoo: DeepSeek-V3.2, GLM-5, whose
``--kv fp8`` vLLM serves as fp8_ds_mla), driven with the ``openai`` client as users drive it.

    python integration/serve_check.py --heads 16 --out results/serve
    python integration/serve_check.py --family DeepSeek-V3.2 --kv fp8 --out results/serve

Pass rules; exit status 1 if one fails:
- Greedy: completions (token ids in, token ids out) for 8 prompts (for a sparse family, two of them
  longer than its top-k of 2048, so that the indexer chooses), sent together, agree with the
  offline engine (``LLM(...)``, same backend and settings, prefix caching off in both) up to the
  offline engine's first tie (a top-2 logprob gap below 0.1 nats; integration/judges/tokens.py's rule),
  or the first step where the offline engine's batch run and its run of each prompt alone part (its
  tokens depend there on what shares the batch, and the server batches requests its own way).
- Load: 96 concurrent streaming requests each finish with the requested number of tokens.
- ``/metrics`` answers with vLLM's counters; the server stops on SIGINT within a minute.
- Bad settings stop start-up with our message in the log: an unknown ``backend`` value, and ``xqa``
  forced on a capability our kernels do not serve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines.vllm_engine import run_engine  # noqa: E402
from integration.engines.vllm_server import (  # noqa: E402
    free_port,
    metrics_answer,
    serve_command,
    stop,
    wait_until_healthy,
)
from integration.engines.vllm_spec import EngineSpec  # noqa: E402
from integration.judges.tokens import agreement  # noqa: E402
from integration.models.prompts import make_prompts, make_sparse_prompts  # noqa: E402
from integration.models.tiny_model import save_tiny_deepseek_v3  # noqa: E402

GREEDY_PROMPTS = 8
SPARSE_MODEL_LEN = 4096  # a sparse family's long prompts (SPARSE_PROMPT_LENGTHS) and their tokens fit
GREEDY_TOKENS = 32
LOAD_REQUESTS, LOAD_TOKENS = 96, 64
START_TIMEOUT_S = 600  # includes building the kernels on a machine without the wheel's
BAD_SETTINGS = {
    "unknown backend value": ({"backend": "nope"}, "nope"),
    "xqa on an unserved GPU": ({"backend": "xqa", "device_capability": "8.0"}, "xqa"),
}


async def greedy_completions(client, model: str, prompts: list[list[int]]) -> list[list[int]]:
    async def one(prompt):
        response = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=GREEDY_TOKENS,
            temperature=0.0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        return response.choices[0].model_extra["token_ids"]

    return list(await asyncio.gather(*(one(p) for p in prompts)))


async def streamed_token_counts(client, model: str, prompts: list[list[int]]) -> list[int]:
    async def one(prompt):
        stream = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=LOAD_TOKENS,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        used = 0
        async for chunk in stream:
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        return used

    return list(await asyncio.gather(*(one(p) for p in prompts)))


async def drive(port: int, model: str, prompts: list[list[int]], load_prompts: list[list[int]]):
    """The greedy completions, then the concurrent streams: (tokens, token counts, load seconds)."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=300) as client:
        tokens = await greedy_completions(client, model, prompts)
        begun = time.monotonic()
        counts = await streamed_token_counts(client, model, load_prompts)
        return tokens, counts, time.monotonic() - begun


def greedy_row(tokens: list[list[int]], offline: dict) -> tuple[str, bool, str]:
    """The served greedy tokens against the offline engine's, under the tie rule; a tie also where the
    offline engine's batch and one-at-a-time runs part (its tokens depend there on what shares the
    batch, and the server batches the requests its own way)."""
    verdict = agreement(tokens, offline["tokens"], offline["gaps"], offline["alone_tokens"])
    note = (
        f"{verdict['identical']}/{len(tokens)} identical, divergences (prompt, step, first tie) {verdict['divergent']}"
    )
    return "greedy vs offline", verdict["ok"], note


def serving_checks(
    spec: EngineSpec, model: str, offline: dict, prompts: list[list[int]], log: Path, max_model_len: int
) -> list:
    port = free_port()
    rows = []
    command = serve_command(spec, model, port, max_model_len=max_model_len)
    with open(log, "w") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        healthy = wait_until_healthy(server, port, START_TIMEOUT_S)
        rows.append(("start", healthy, f"after {time.monotonic() - started:.0f} s (exit {server.poll()}; {log.name})"))
        if healthy:
            load_prompts = [p for seed in range(LOAD_REQUESTS // 12) for p in make_prompts(seed)]  # 12 per seed
            tokens, counts, seconds = asyncio.run(drive(port, model, prompts, load_prompts))
            rows.append(greedy_row(tokens, offline))
            finished = sum(c == LOAD_TOKENS for c in counts)
            rows.append(
                (
                    f"{LOAD_REQUESTS} concurrent streams",
                    finished == LOAD_REQUESTS,
                    f"{finished}/{LOAD_REQUESTS} got {LOAD_TOKENS} tokens in {seconds:.1f} s "
                    f"({sum(counts) / seconds:.0f} tok/s)",
                )
            )
            rows.append(("/metrics", metrics_answer(port), "vLLM counters served"))
    finally:
        stopped = stop(server)
        rows.append(("stop on SIGINT", stopped, f"exit {server.returncode}"))
    return rows


def bad_setting_checks(spec: EngineSpec, model: str, out: Path, max_model_len: int) -> list:
    """Each bad setting must stop start-up (non-zero exit) with our message in the log."""
    rows = []
    for name, (setting, word) in BAD_SETTINGS.items():
        log = out / f"serve_bad_{setting['backend']}.log"
        with open(log, "w") as sink:
            done = subprocess.run(
                serve_command(spec, model, free_port(), setting, max_model_len=max_model_len),
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=START_TIMEOUT_S,
            )
        ours = [line for line in log.read_text().splitlines() if "mla_backend" in line and word in line]
        ok = done.returncode != 0 and bool(ours)
        rows.append(
            (
                f"refused: {name}",
                ok,
                f"exit {done.returncode}: {ours[-1].strip()[:200] if ours else 'no message of ours'}",
            )
        )
    return rows


def served_model(family_name: str | None, heads: int, model_dir: Path) -> tuple[str, str, list[list[int]], int]:
    """(checkpoint, its name in the report, the greedy prompts, max_model_len): the tiny DeepSeek-V3 at
    ``heads``, or a sparse family's seeded checkpoint with prompts past its top-k."""
    if family_name is None:
        path = save_tiny_deepseek_v3(model_dir / f"dsv3_h{heads}", heads=heads)
        return str(path), f"h{heads}", make_prompts(0)[:GREEDY_PROMPTS], 2048
    from integration.models.checkpoints import save_sparse_checkpoint

    try:
        family, path = save_sparse_checkpoint(family_name, model_dir)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prompts = make_sparse_prompts(vocab) + make_prompts(0, vocab)[: GREEDY_PROMPTS - 4]
    return str(path), family.name, prompts, SPARSE_MODEL_LEN


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--family", help="a sparse family of the zoo (DeepSeek-V3.2, GLM-5) instead of DeepSeek-V3")
    parser.add_argument("--kv", default="fp8", choices=["fp8", "auto"])
    parser.add_argument("--out", type=Path, default=Path("results/serve"))
    parser.add_argument("--model-dir", default="/tmp/mla_backend_models")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model, name, prompts, max_model_len = served_model(args.family, args.heads, Path(args.model_dir))
    spec = EngineSpec("CUSTOM", args.kv, 64, True, max_num_seqs=GREEDY_PROMPTS)
    # frees the GPU before serving
    offline = run_engine(spec, model, prompts, max_tokens=GREEDY_TOKENS, max_model_len=max_model_len, also_alone=True)
    rows = serving_checks(spec, model, offline, prompts, args.out / "serve.log", max_model_len)
    rows += bad_setting_checks(spec, model, args.out, max_model_len)
    (args.out / f"serve_{name}_{args.kv}.json").write_text(json.dumps(rows, indent=1))
    print(f"\n== vllm serve, {name}, kv {args.kv} ==")
    for name, ok, note in rows:
        print(f"{'PASS' if ok else 'FAIL':5} {name:28} {note}")
    return 0 if all(ok for _, ok, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
