"""SGLang's triton MLA backend behind our name, for GPUs the bundled kernels do not serve.

DeepSeek's model code hands a backend registered as absorbing (ours) the query and the new key as
two parts each; SGLang's triton backend takes them joined ([T, H, 576] and [T, 1, 576]).
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend


def _joined(q, k, q_rope, k_rope, layer):
    rope = layer.head_dim - layer.v_head_dim
    if q_rope is not None:
        heads = layer.tp_q_head_num
        q = torch.cat([q.reshape(-1, heads, layer.v_head_dim), q_rope.reshape(-1, heads, rope)], -1)
    if k is not None and k_rope is not None:
        k = torch.cat([k.reshape(-1, 1, layer.v_head_dim), k_rope.reshape(-1, 1, rope)], -1)
    return q, k


class JoinedQueryTritonBackend(TritonAttnBackend):
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None, **kwargs):
        q, k = _joined(q, k, q_rope, k_rope, layer)
        return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None, **kwargs):
        q, k = _joined(q, k, q_rope, k_rope, layer)
        return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)


def triton_backend(runner) -> TritonAttnBackend:
    return JoinedQueryTritonBackend(runner)
