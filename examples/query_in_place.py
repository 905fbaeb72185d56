"""The op with the query as two strided parts, as vLLM's MLA hands a bf16 decode over, against
concatenating them first (CUDA-graph replay, median). The outputs are bit-identical.

    python examples/query_in_place.py
"""

import torch

from mla_backend import xqa_batch_decode_with_kv_cache_mla
from mla_backend.inputs import make_paged_problem, vllm_bf16_query_layout
from mla_backend.tools.bench import time_graph

workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
for heads, batch, seq in [(128, 32, 2048), (16, 32, 2048), (128, 1, 8192), (128, 128, 1024)]:
    problem = make_paged_problem([seq] * batch, 1, heads, 64, torch.bfloat16, "cuda", seed=1)
    q_nope, q_pe = vllm_bf16_query_layout(problem.query)  # strided views, as vLLM hands them over
    args = (problem.kv_cache, workspace, 128, 512, 64, problem.block_tables, problem.seq_lens, problem.max_seq_len)

    def concatenated():
        return xqa_batch_decode_with_kv_cache_mla(torch.cat((q_nope, q_pe), dim=-1), *args, bmm1_scale=0.07)

    def in_place():
        return xqa_batch_decode_with_kv_cache_mla((q_nope, q_pe), *args, bmm1_scale=0.07)

    assert torch.equal(concatenated(), in_place())
    t_cat, t_pair = time_graph([concatenated]), time_graph([in_place])
    print(
        f"bf16 H{heads} B{batch} seq {seq}: cat + op {t_cat:.1f} us, pair in place {t_pair:.1f} us, "
        f"saved {t_cat - t_pair:.1f} us"
    )
