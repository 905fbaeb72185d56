"""Mutation testing of the CPU suite: break the code one line at a time and check a test notices.

    python dev/mutations.py              # every mutation, two at a time; a table at the end
    python dev/mutations.py --only 3,17  # some of them

Each mutation replaces one exact snippet (it must occur exactly once) in a copy of the checkout;
the CPU tests then run against that copy (``-x``, tests/test_build.py and the wheel tests left out;
the tests that read the kernel library build it into the copy's own cache, again only after a
mutation of csrc/). A mutation survives when they all pass. Run it before a release, not in CI (about 90 minutes on two
cores); docs/validation.md lists the last result.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [
    sys.executable,
    "-m",
    "pytest",
    "-x",
    "-q",
    "-p",
    "no:cacheprovider",
    "-m",
    "not gpu and not wheel and not sglang",
    "tests",
    "--ignore",
    "tests/test_build.py",
    "--ignore",
    "tests/test_wheel.py",
]


@dataclass(frozen=True)
class Mutation:
    path: str
    old: str
    new: str
    what: str


M = Mutation
MUTATIONS = [
    # input checks
    M("mla_backend/flashinfer_api.py", "if sinks is not None:", "if False:", "sinks accepted"),
    M(
        "mla_backend/checks.py",
        "1 <= q_len <= shapes.MAX_Q_LEN",
        "1 <= q_len <= shapes.MAX_Q_LEN + 1",
        "q_len 9 accepted",
    ),
    M(
        "mla_backend/checks.py",
        "1 <= heads <= shapes.MAX_HEADS",
        "0 <= heads <= shapes.MAX_HEADS",
        "zero heads accepted",
    ),
    M("mla_backend/checks.py", "page_size in shapes.PAGE_SIZES", "page_size > 0", "any page size accepted"),
    M(
        "mla_backend/checks.py",
        "max_seq_len <= max_pages * page_size,",
        "max_seq_len <= (max_pages + 1) * page_size,",
        "max_seq_len bound off by a page",
    ),
    M(
        "mla_backend/checks.py",
        "block_tables.dtype == torch.int32",
        "block_tables.dtype in (torch.int32, torch.int64)",
        "int64 block tables accepted",
    ),
    M("mla_backend/checks.py", "int(ids.min()) < 0 or ", "", "negative page ids accepted"),
    M(
        "mla_backend/checks.py",
        "0 <= seq_len <= problem.max_seq_len",
        "seq_len <= problem.max_seq_len",
        "negative seq_lens accepted",
    ),
    M(
        "mla_backend/checks.py",
        "used = -(-seq_len // problem.page_size)",
        "used = seq_len // problem.page_size",
        "last partial page not validated",
    ),
    M("mla_backend/checks.py", "t.shape[:-1]) if n > 1)", "t.shape[:-1]) if n > 0)", "size-1 dims' strides checked"),
    M(
        "mla_backend/checks.py",
        'if t.data_ptr() % 16:\n        return f"{name} must start at a 16-byte aligned address"\n'
        "    return None\n\n\ndef check_",
        'if t.data_ptr() % 2:\n        return f"{name} must start at a 16-byte aligned address"\n'
        "    return None\n\n\ndef check_",
        "query alignment 2 bytes",
    ),
    M("mla_backend/checks.py", '_require(out.is_contiguous(), "out must be contiguous")', "", "strided out accepted"),
    M("mla_backend/checks.py", "if q_len == 1 else []", "if q_len >= 1 else []", "3-D out for q_len > 1"),
    M("mla_backend/checks.py", "scale.numel() == 1", "scale.numel() >= 1", "multi-element scale accepted"),
    M("mla_backend/checks.py", "kv_cache.shape[1] == 1", "kv_cache.shape[1] >= 1", "4-D cache with 2 heads"),
    M(
        "mla_backend/checks.py",
        "if t.stride(1) * size % 16 or",
        "if False or",
        "misaligned cache token stride accepted",
    ),
    M("mla_backend/checks.py", 'kv_parts = {"kv_cache": kv_given}', "kv_parts = {}", "cache layout unchecked"),
    # the op
    M(
        "mla_backend/decode.py",
        "lse_log2.float().view(lse.shape) * LN2",
        "lse_log2.float().view(lse.shape)",
        "trtllm-gen LSE left in base 2",
    ),
    M(
        "mla_backend/decode.py",
        "problem.query.contiguous(),",
        "problem.query,",
        "trtllm-gen given a strided query",
    ),
    M(
        "mla_backend/decode.py",
        "problem.bmm1_scale,\n            problem.bmm2_scale,\n        )",
        "problem.bmm1_scale,\n            1.0,\n        )",
        "bmm2 scale dropped (CPU path)",
    ),
    M("mla_backend/decode.py", "lse.copy_(reference_lse)", "pass", "LSE not written (CPU path)"),
    M(
        "mla_backend/decode.py",
        "return result_out, (lse if lse is not None else lse_rows)",
        "return result_out, lse_rows",
        "caller's lse buffer not returned",
    ),
    # FlashInfer's API
    M(
        "mla_backend/flashinfer_api.py",
        "_to_lse_base(result_lse, return_lse_base or default_base)",
        "pass",
        "FlashInfer names return the natural log",
    ),
    M(
        "mla_backend/flashinfer_api.py",
        'default_base = "basee" if packed is not None or dcp is not None else "base2"',
        'default_base = "base2"',
        "DCP and variable-length LSE in base 2",
    ),
    M(
        "mla_backend/flashinfer_api.py",
        "source = cum[1:, None] - self.max_q_len + slots[None, :]",
        "source = cum[:-1, None] + slots[None, :]",
        "variable-length queries left-aligned (wrong causal bounds)",
    ),
    M(
        "mla_backend/flashinfer_api.py",
        "+ steps[None, :] - self.rank",
        "+ steps[None, :]",
        "DCP bound ignores the rank",
    ),
    M(
        "mla_backend/flashinfer_api.py",
        "if uses_shared_paged_kv_idx is not True:",
        "if False:",
        "TRT-LLM 3-D page tables accepted",
    ),
    M(
        "mla_backend/decode.py",
        "out = problem.out_given if problem.out_given is not None else problem.out",
        "out = problem.out",
        "caller's out not returned as passed",
    ),
    M(
        "mla_backend/flashinfer_api.py",
        "if sparse_mla_top_k != 0:",
        "if sparse_mla_top_k > 1 << 20:",
        "sparse accepted",
    ),
    # the float64 reference
    M(
        "mla_backend/reference.py",
        "max(0, seq_len - q_len + i + 1)",
        "max(0, seq_len - q_len + i)",
        "causal mask off by one",
    ),
    M(
        "mla_backend/reference.py",
        "keys[:, :kv_lora_rank]) * s2",
        "keys[:, :kv_lora_rank]) * s2 * 1.01",
        "output 1% high",
    ),
    M(
        "mla_backend/reference.py",
        'torch.einsum("thd,ld->thl", q, keys) * s1',
        'torch.einsum("thd,ld->thl", q, keys[:, :576]) * s1 * 1.02',
        "logits 2% high",
    ),
    # config and routing
    M(
        "mla_backend/config.py",
        'lowered in {"1", "true", "yes", "on"}',
        'lowered in {"1", "true", "on"}',
        "'yes' not a true switch",
    ),
    M("mla_backend/config.py", "frozen=True, strict=True", "frozen=True", "Python/JSON values coerced"),
    M("mla_backend/config.py", 'extra="forbid"', 'extra="ignore"', "unknown settings ignored"),
    M("mla_backend/config.py", "        ge=1,\n", "        ge=0,\n", "zero splits accepted"),
    M(
        "mla_backend/route.py",
        "    if capability in TRTLLM_GEN_CAPABILITIES and has_flashinfer:\n",
        "    if capability in TRTLLM_GEN_CAPABILITIES:\n",
        "auto picks trtllm-gen without FlashInfer",
    ),
    M(
        "mla_backend/route.py",
        "        if arch is None:\n            raise",
        "        if False:\n            raise",
        "xqa forced anywhere",
    ),
    M(
        "mla_backend/config.py",
        "values.update(dict(overrides or {}))",
        "values = {**dict(overrides or {}), **values}",
        "environment beats explicit settings",
    ),
    M(
        "mla_backend/config.py",
        "k not in ENV_FIELDS and k not in BUILD_ENV",
        "k not in ENV_FIELDS",
        "MLA_BACKEND_ARCHS rejected as a typo",
    ),
    M("mla_backend/config.py", 'raw.strip() != ""', 'raw != ""', "blank variable not unset"),
    M("mla_backend/targets.py", '    (12, 1): "sm_121a",  # GB10 (DGX Spark)\n', "", "SM 12.1 dropped"),
    M(
        "mla_backend/targets.py",
        "frozenset({(10, 0), (10, 3)})",
        "frozenset({(10, 0), (10, 3), (12, 0)})",
        "trtllm-gen claimed on SM 12.0",
    ),
    # the library's scheduling formulas (killed by the build tests, which compile the mutated csrc/)
    M(
        "csrc/schedule/workspace.h",
        "partial_rows * (kDimV + 1) *",
        "partial_rows * kDimV *",
        "workspace misses the LSE",
    ),
    M(
        "csrc/schedule/host_schedule.h",
        "ceil_div<int64_t>(max_seq_len, kBlockN * kMinTilesPerSplit)",
        "ceil_div<int64_t>(max_seq_len, kBlockN)",
        "splits below 128 tokens",
    ),
    M(
        "csrc/schedule/host_schedule.h",
        "std::max<int64_t>(1, slots / row_blocks)",
        "std::max<int64_t>(1, slots)",
        "plan pieces ignore the row blocks",
    ),
    M(
        "csrc/schedule/plan_layout.h",
        "return (kCutWaves + 1) * pieces;",
        "return pieces;",
        "plan workspace holds partials for one split a piece",
    ),
    M(
        "csrc/schedule/host_schedule.h",
        "(step_plan ? kStepPlanMinBatch : kPlanMinBatch)",
        "(step_plan ? kStepPlanMinBatch : 1)",
        "small batches planned on the GPU",
    ),
    M(
        "csrc/schedule/host_schedule.h",
        "std::min({useful, fits, int64_t{kMaxSplits}})",
        "std::min({useful, int64_t{kMaxSplits}})",
        "split count ignores the workspace",
    ),
    M(
        "mla_backend/step_plan.py",
        "(plan.batch, plan.rows, plan.fp8) == (problem.batch, rows, fp8)",
        "(plan.batch, plan.fp8) == (problem.batch, fp8)",
        "a step plan for other heads accepted",
    ),
    M(
        "mla_backend/vllm/backend.py",
        'plan=getattr(decode, "plan", None),',
        "plan=None,",
        "vLLM's layers ignore the step's plan",
    ),
    # vLLM adapter
    M(
        "mla_backend/vllm/backend.py",
        "can_return_lse_for_decode: bool = True",
        "can_return_lse_for_decode: bool = False",
        "LSE not offered to DCP",
    ),
    M("mla_backend/vllm/backend.py", "supports_dcp: bool = True", "supports_dcp: bool = False", "DCP refused"),
    M("mla_backend/vllm/backend.py", " or logits_soft_cap:", ":", "soft-capped logits accepted"),
    M(
        "mla_backend/vllm/backend.py",
        "if attn_type != AttentionType.DECODER:",
        "if False:",
        "encoder attention accepted",
    ),
    M(
        "mla_backend/vllm/backend.py",
        "AttentionCGSupport.UNIFORM_BATCH",
        "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE",
        "no full graphs for speculative batches",
    ),
    M(
        "mla_backend/vllm/backend.py",
        "query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM",
        "query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.SINGLE_ONLY",
        "speculative batches not decoded",
    ),
    M(
        "mla_backend/vllm/backend.py",
        "return self.scale * layer._q_scale_float * layer._k_scale_float, layer._k_scale_float",
        "return self.scale * layer._q_scale_float * layer._k_scale_float, 1.0",
        "fp8 V scale dropped",
    ),
    M(
        "mla_backend/vllm/backend.py",
        'self.supports_quant_query_input = self.route.kernel != "fallback"',
        "self.supports_quant_query_input = True",
        "fp8 query sent to the Triton fallback",
    ),
    M(
        "mla_backend/vllm/backend.py",
        "DecodeShape(local_heads * dcp,",
        "DecodeShape(local_heads,",
        "DCP's gathered heads not counted",
    ),
    M(
        "mla_backend/vllm/backend.py",
        "        return list(shapes.PAGE_SIZES)",
        "        return [64]",
        "page sizes 16/32/128 refused",
    ),
    M(
        "mla_backend/vllm/backend.py",
        '            return f"mla_backend: {err}"',
        "            return None",
        "bad setting accepted at selection",
    ),
    M(
        "mla_backend/vllm/backend.py",
        'if len(parts) == 2 and (route.kernel != "bundled" or any(',
        "if len(parts) == 2 and (any(",
        "split query sent to a route that needs it whole",
    ),
    M(
        "mla_backend/vllm/backend.py",
        "        if tokens % requests:",
        "        if False:",
        "ragged query lengths accepted",
    ),
    M(
        "mla_backend/vllm/fallback.py",
        "torch.arange(1 - q_len, 1,",
        "torch.arange(-q_len, 0,",
        "fallback's per-token lengths off by one",
    ),
    M(
        "mla_backend/vllm/compat.py",
        'return getattr(attn_metadata, "causal", True) is False',
        "return False",
        "non-causal blocks decoded as causal",
    ),
    # end-to-end judge
    M(
        "integration/judges/tokens.py",
        "    if step is None and len(a) != len(b):",
        "    if False:",
        "short output counts as identical",
    ),
    M(
        "integration/judges/tokens.py",
        "        if differ < first_tie:",
        "        if differ < first_tie - 1:",
        "divergence one step before a tie passes",
    ),
    M(
        "integration/judges/decode_verdict.py",
        'ok = worst <= check["tolerance"] and check["lse_ok"]',
        'ok = worst <= check["tolerance"]',
        "wrong LSE passes",
    ),
    M(
        "integration/judges/decode_verdict.py",
        '"graph calls": 1 if spec["graphs"] else 0',
        '"graph calls": 0',
        "graph mode passes with no replay checked",
    ),
    M(
        "integration/judges/speculation.py",
        ' and counts.get("num_drafts", 0) > 0',
        "",
        "speculation passes without drafts",
    ),
    M(
        "integration/judges/vllm_run.py",
        'triton = refs["TRITON_MLA" + kv]',
        'triton = refs["FLASHMLA" + kv]',
        "fallback judged against FlashMLA",
    ),
    M(
        "integration/judges/decode_check.py",
        "MIN_VISIBLE_KEYS = 16",
        "MIN_VISIBLE_KEYS = 1",
        "1-key rows count as checked",
    ),
    M(
        "integration/judges/decode_check.py",
        "lse_ok = bool((delta <= allowed).all())",
        "lse_ok = True",
        "LSE never wrong",
    ),
    M(
        "mla_backend/vllm/backend.py",
        "(current_platform.num_compute_units(), vllm_config.scheduler_config.max_num_seqs)",
        "(current_platform.num_compute_units(), 1)",
        "FlashMLA graph plan buffers sized for one request",
    ),
    # building and loading
    M("mla_backend/jit.py", " and not strict:", ":", "a strict build takes a cached library"),
    M(
        "mla_backend/toolkit.py",
        '("CUDA_HOME", "CUDA_PATH")',
        '("CUDA_PATH", "CUDA_HOME")',
        "CUDA_PATH before CUDA_HOME",
    ),
    # the shared tile table
    M("mla_backend/launcher.py", "rows <= shape.max_rows", "rows < shape.max_rows", "16 rows take the 32-row tile"),
    M("csrc/constants.h", "X(0, 16, 1, 1)", "X(0, 8, 1, 1)", "tile table edited on one side only"),
    # auto's FlashMLA route (vLLM on SM90)
    M(
        "mla_backend/vllm/flashmla.py",
        "lse.permute(0, 2, 1).reshape(tokens, heads)",
        "lse.reshape(tokens, heads)",
        "FlashMLA's LSE read in its own layout",
    ),
    M("mla_backend/sm90_table.py", "if speedup <= 1.0:", "if speedup < 0.5:", "FlashMLA taken where slower"),
    M(
        "mla_backend/sm90_table.py",
        'if not entry["flashmla_correct"]:',
        "if False:",
        "FlashMLA taken where it failed its check",
    ),
    M(
        "mla_backend/vllm/backend.py",
        '        if route.kernel == "flashmla":  # auto on SM90',
        "        if False:  # auto on SM90",
        "planned batches still sent to ours",
    ),
    M(
        "mla_backend/vllm/flashmla.py",
        "            tiles = _into(self.tile_buffer, tiles)",
        "            pass",
        "fp8 plans outside the graph buffers",
    ),
    M(
        "mla_backend/vllm/flashmla.py",
        "        query_rows = q_len * self.heads",
        "        query_rows = self.heads",
        "plan ignores the draft tokens",
    ),
    # the op's backend argument (resolved for GPU tensors before any launch)
    M("mla_backend/route.py", '    if backend != "auto":\n', "    if False:\n", "backend argument ignored"),
    M(
        "mla_backend/route.py",
        "resolve_route(config, config.capability(torch.cuda.get_device_capability(device)))",
        "resolve_route(config, torch.cuda.get_device_capability(device))",
        "capability override ignored by the op",
    ),
    M(
        "mla_backend/route.py",
        '    if route.kernel == "fallback":\n        raise BackendUnavailableError(',
        "    if False:\n        raise BackendUnavailableError(",
        "op launches with no kernel",
    ),
    # the Triton fallback against vLLM's real op (Triton's interpreter)
    M(
        "mla_backend/vllm/fallback.py",
        "        cache[..., :kv_lora_rank],",
        "        cache[..., -kv_lora_rank:],",
        "fallback's V slice at the wrong offset",
    ),
    M(
        "mla_backend/vllm/fallback.py",
        "        v_scale=k_scale,",
        "        v_scale=None,",
        "fallback's V left unscaled",
    ),
    M(
        "mla_backend/vllm/fallback.py",
        "shape[2],\n        sm_scale,",
        "shape[2] * 2,\n        sm_scale,",
        "fallback told more splits than its scratch holds",
    ),
    # the end-to-end judge
    M(
        "integration/judges/vllm_run.py",
        '    if result["routes"] != [expect_route]:',
        '    if expect_route not in result["routes"] + [expect_route]:',
        "the judge ignores the route that served the run",
    ),
    # the route table lookup
    M(
        "mla_backend/sm90_table.py",
        "return min(close, key=distance) if close else None",
        "return close[0] if close else None",
        "the first close measurement, not the nearest",
    ),
    M(
        "mla_backend/sm90_table.py",
        'return (abs(math.log2(entry["heads"] / heads)), abs(math.log2(entry["q_len"] / q_len)))',
        'return (abs(math.log2(entry["q_len"] / q_len)), abs(math.log2(entry["heads"] / heads)))',
        "nearest by query tokens first",
    ),
    M(
        "mla_backend/sm90_table.py",
        '    close = [e for e in entries if e["kv"] == kv and max(distance(e)) <= limit]',
        "    close = [e for e in entries if max(distance(e)) <= limit]",
        "a class borrows the other KV dtype's measurement",
    ),
    M(
        "mla_backend/sm90_table.py",
        "    table = load_table()\n    entry = nearest(",
        '    table = {"device": "none", "date": "", "entries": []}\n    entry = nearest(',
        "the shipped table never read",
    ),
    # the op's contract: what the property tests found
    M(
        "mla_backend/checks.py",
        'device.type in ("cpu", "cuda"),',
        'device.type != "mps",',
        "a meta query reaches a kernel",
    ),
    M("mla_backend/checks.py", "_require(math.isfinite(value),", "_require(True,", "an infinite scale accepted"),
    # engine judges and drivers
    M(
        "integration/judges/tokens.py",
        '    if not verdict["rule_holds"]:\n',
        "    if True:\n",
        "the calibrated rule taken where the peer keeps the tie rule",
    ),
    M(
        "integration/engines/sglang_engine.py",
        "    return {**env, **stand_in_env(env)}",
        "    return {**stand_in_env(env), **env}",
        "a checked SGLang engine loses the FlashInfer and DeepGEMM stand-ins",
    ),
    M(
        "integration/judges/faults.py",
        "ok = usage <= USAGE_IDLE_MAX and running == 0",
        "ok = usage <= 1e-4 and running == 0",
        "a leaked block passes as idle",
    ),
    M(
        "integration/judges/faults.py",
        "    return bool(GPU_FAULT.search(line))",
        "    return False",
        "a GPU fault logged as a warning passes",
    ),
    M(
        "integration/judges/speculation.py",
        'ok = ok and (drafted > 0 or spec["spec_tokens"] < 2)',
        "ok = ok",
        "an MLA drafter passes while drafting on another backend",
    ),
    M(
        "integration/engines/vllm_spec.py",
        '            "attention_backend": spec.backend,\n',
        "",
        "the Eagle3 drafter left to vLLM's own backend",
    ),
    M(
        "mla_backend/vllm/drafter.py",
        "if draft is None or not draft.use_mla:",
        "if True:",
        "no start-up hint for a drafter left to vLLM",
    ),
    M(
        "mla_backend/vllm/backend.py",
        "        return shapes.PREFERRED_PAGE_SIZE\n",
        "        return default_block_size\n",
        "vLLM's default 16-token pages where --block-size names none",
    ),
    M(
        "integration/judges/decode_check.py",
        "    private[rows] = call.own_keys[present]\n",
        "",
        "a call judged on cache rows a drafter rewrote after it",
    ),
    M(
        "integration/judges/tokens.py",
        'verdict["ok"] = verdict["ok"] or verdict["agreed_steps"]',
        'verdict["ok"] = verdict["agreed_steps"]',
        "the calibrated rule fails ours where it keeps the tie rule",
    ),
]


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def make_copy() -> Path:
    copy = Path(tempfile.mkdtemp(prefix="mla_mutant_"))
    for name in tracked_files():
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return copy


def run_tests(copy: Path) -> subprocess.CompletedProcess:
    cache = copy.with_name(copy.name + "_cache")  # the copy's kernel library, rebuilt when csrc/ differs
    env = dict(os.environ, PYTHONPATH=str(copy), HF_HUB_OFFLINE="1", MLA_BACKEND_CACHE_DIR=str(cache))
    return subprocess.run(PYTEST, cwd=copy, env=env, capture_output=True, text=True)


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line.split(" - ")[0].removeprefix("FAILED ").removeprefix("ERROR ")
    return "(no test named)"


def try_mutation(mutation: Mutation, copy: Path) -> tuple[bool, str]:
    target = copy / mutation.path
    original = target.read_text()
    count = original.count(mutation.old)
    if count != 1:
        raise SystemExit(f"mutation {mutation.what!r}: snippet found {count} times in {mutation.path}")
    target.write_text(original.replace(mutation.old, mutation.new))
    try:
        result = run_tests(copy)
    finally:
        target.write_text(original)
    return result.returncode != 0, first_failure(result.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated mutation numbers (1-based)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    chosen = [int(i) for i in args.only.split(",")] if args.only else range(1, len(MUTATIONS) + 1)
    copies = [make_copy() for _ in range(args.workers)]
    baseline = run_tests(copies[0])
    if baseline.returncode != 0:
        print(baseline.stdout[-3000:])
        raise SystemExit("the unmutated copy fails its tests: fix that first")
    free = list(copies)

    def job(number: int):
        copy = free.pop()
        try:
            return number, *try_mutation(MUTATIONS[number - 1], copy)
        finally:
            free.append(copy)

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(job, chosen))
    survivors = 0
    print("| # | file | mutation | result |\n| --- | --- | --- | --- |")
    for number, killed, test in results:
        mutation = MUTATIONS[number - 1]
        survivors += not killed
        print(
            f"| {number} | `{mutation.path}` | {mutation.what} | "
            f"{'killed by `' + test + '`' if killed else '**survived**'} |"
        )
    print(f"\n{len(results)} mutations, {len(results) - survivors} killed, {survivors} survived")
    for copy in copies:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(copy.with_name(copy.name + "_cache"), ignore_errors=True)
    return 1 if survivors > 3 else 0


if __name__ == "__main__":
    sys.exit(main())
