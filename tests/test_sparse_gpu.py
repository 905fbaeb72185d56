"""Sparse MLA decode on the GPU (DeepSeek Sparse Attention) at FlashMLA's sparse tolerances, against the
float64 reference on the dequantised cache: FlashMLA's and FlashInfer's sparse grids (heads, top-k,
tokens, scale formats, empty entries), lists wider than 2048, empty rows, ids past the cache, lengths
shorter than the lists, CUDA graphs with padded rows, a soak of mixed calls. Every cache row no valid
entry names is NaN, outputs are NaN-poisoned before each call, and every call runs under a watchdog
(a hang exits the run; gpu_watchdog.py)."""

from __future__ import annotations

import pytest
import torch
from gpu_watchdog import finish_or_die
from graph_capture import capture
from peer_grids import FLASHMLA_SPARSE_OUT, assert_lse_exact, flashmla_rule

from mla_backend import MLABackendConfig
from mla_backend.config import default_config
from mla_backend.reference import sparse_mla_reference
from mla_backend.sparse import sparse_mla_decode
from mla_backend.sparse_problems import SparseCase, make_sparse_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

KINDS = ["bf16", "pow2_fp32", "arbitrary_fp32"]


def run(case: SparseCase, what: str, config: MLABackendConfig | None = None):
    """The op on NaN-poisoned buffers under the watchdog; returns (out, natural-log LSE)."""
    tokens, heads, _ = case.query.shape
    out = torch.full((tokens, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((tokens, heads), float("nan"), device="cuda")
    sparse_mla_decode(
        case.query, case.kv_cache, case.indices, case.sm_scale, topk_lens=case.topk_lens, out=out, lse=lse,
        config=config,
    )  # fmt: skip
    finish_or_die(what)
    return out, lse


def reference(case: SparseCase):
    return sparse_mla_reference(
        case.query, case.kv_rows.to("cuda"), case.indices, case.sm_scale, topk_lens=case.topk_lens
    )


def assert_matches(case: SparseCase, out, lse):
    want, want_lse = reference(case)
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) output, or a masked or unlisted row was read"
    verdict = flashmla_rule(out, want, **FLASHMLA_SPARSE_OUT)
    assert verdict.passed, f"out: {verdict.why} (largest error {verdict.max_abs:.2e})"
    assert_lse_exact(lse, want_lse)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("invalid", ["none", "tail", "scattered"])
@pytest.mark.parametrize("heads", [8, 16, 64, 128])
@pytest.mark.parametrize("tokens, topk", [(1, 2048), (5, 128), (70, 2048), (3, 576)])
def test_sparse_grid(kind, invalid, heads, tokens, topk):
    case = make_sparse_case(tokens, heads, topk, kind, "cuda", seed=heads + tokens + topk, invalid=invalid)
    assert_matches(case, *run(case, f"{kind} {invalid} {heads}x{tokens}x{topk}"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("heads", [17, 24, 32, 40])
def test_head_counts_that_part_fill_a_32_row_tile(kind, heads):
    """Over 16 heads a token's rows take 32-row tiles (on sm_90a fp8_ds_mla's FP8 tile): V3.2 at TP4 has
    32, and a count between fills its last tile in part, whose rows past the heads must read as zero Q
    and never be written."""
    case = make_sparse_case(6, heads, 2048, kind, "cuda", seed=heads, invalid="scattered")
    assert_matches(case, *run(case, f"{kind} {heads} heads"))


@pytest.mark.parametrize("kind", ["bf16", "arbitrary_fp32"])
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("topk", [2049, 3000, 4096])
def test_lists_wider_than_2048(kind, heads, topk):
    case = make_sparse_case(4, heads, topk, kind, "cuda", seed=topk, invalid="scattered")
    assert_matches(case, *run(case, f"topk {topk}"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("heads", [8, 128])
def test_a_token_whose_list_is_all_empty_gives_zero_and_minus_inf(kind, heads):
    case = make_sparse_case(9, heads, 2048, kind, "cuda", seed=5, invalid="all_some_tokens")
    out, lse = run(case, "all-empty lists")
    assert torch.all(out[::3] == 0) and torch.all(torch.isneginf(lse[::3]))
    assert_matches(case, out, lse)


@pytest.mark.parametrize("kind", KINDS)
def test_ids_past_the_cache_are_masked(kind):
    case = make_sparse_case(12, 16, 2048, kind, "cuda", seed=6, invalid="past_the_end")
    assert_matches(case, *run(case, "ids past the cache"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [65, 128])
def test_entries_past_topk_lens_are_never_read(kind, tokens):
    """FlashInfer #5095: more than 64 tokens with lengths shorter than the lists, whose tails name
    NaN rows; lengths of 0 give empty rows."""
    case = make_sparse_case(tokens, 16, 2048, kind, "cuda", seed=tokens, random_lens=True, invalid="scattered")
    case.topk_lens[:3] = torch.tensor([0, 1, 2048], dtype=torch.int32)
    assert_matches(case, *run(case, "topk_lens"))


@pytest.mark.parametrize("splits", [1, 3, 16])
def test_forced_split_counts_agree(splits):
    case = make_sparse_case(6, 64, 2048, "pow2_fp32", "cuda", seed=splits, invalid="scattered")
    config = default_config().model_copy(update={"num_kv_splits": splits})  # the environment's kernel variant
    assert_matches(case, *run(case, f"{splits} splits", config))


def test_a_corrupted_index_is_caught():
    """The comparison can fail: one listed row swapped for another changes the result."""
    case = make_sparse_case(4, 16, 128, "bf16", "cuda", seed=9, poison=False)
    out, lse = run(case, "corrupted index")
    case.indices[0, 0] = (case.indices[0, 0] + 1) % case.kv_rows.shape[0]
    want, _ = reference(case)
    assert not flashmla_rule(out, want, **FLASHMLA_SPARSE_OUT).passed


@pytest.mark.parametrize("kind", ["bf16", "pow2_fp32"])
def test_a_graph_with_padded_rows_replays_and_returns(kind):
    """FlashInfer #5015: a CUDA graph captured for 8 rows (4 requests x 2 tokens) replayed with 3
    requests: the padded rows' lists are all -1 or stale; the replay returns and the pad rows are 0."""
    case = make_sparse_case(8, 16, 2048, kind, "cuda", seed=15, poison=False)
    out = torch.empty(8, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(8, 16, device="cuda")
    workspace = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")

    def step():
        sparse_mla_decode(
            case.query, case.kv_cache, case.indices, case.sm_scale, out=out, lse=lse, workspace_buffer=workspace
        )

    graph, _ = capture(step)
    fresh = make_sparse_case(8, 16, 2048, kind, "cuda", seed=16, poison=False)
    case.query.copy_(fresh.query)
    case.indices.copy_(fresh.indices)
    case.indices[6:] = -1  # the pad rows: empty lists
    for stale in (False, True):
        if stale:
            case.indices[7] = fresh.indices[0]  # a stale list from an earlier step
        out.fill_(float("nan"))
        graph.replay()
        finish_or_die(f"graph replay with padded rows (stale={stale})")
        assert torch.all(out[6] == 0) and torch.all(torch.isneginf(lse[6]))
        assert_matches(case, out, lse)


def test_a_soak_of_mixed_calls_never_hangs():
    """vLLM #51921 (a livelock under sustained load): 120 calls of mixed token counts (1 to 256),
    heads, formats and empty entries in a row, each finished under the watchdog and checked."""
    patterns = ["none", "tail", "scattered", "all_some_tokens", "past_the_end"]
    for i in range(120):
        tokens = [1, 2, 7, 64, 65, 200, 256][i % 7]
        heads = [8, 16, 64, 128][i % 4]
        case = make_sparse_case(
            tokens, heads, 2048, KINDS[i % 3], "cuda", seed=100 + i, invalid=patterns[i % 5], random_lens=i % 2 == 1
        )
        out, lse = run(case, f"soak call {i}")
        if i % 10 == 0:
            assert_matches(case, out, lse)
        else:
            assert not torch.isnan(out).any()
