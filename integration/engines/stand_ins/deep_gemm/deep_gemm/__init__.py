"""Stand-in for DeepGEMM where it is not installed (the lent GPU's image). SGLang 0.5.17's speculative
decoding imports its sparse-attention (DSA) backend while capturing the drafter's CUDA graphs, and that
module imports deep_gemm at load on CUDA. A sparse model's indexer asks for the SM count when it is
built, before SGLang asks for a decode backend (where ours refuses the model): get_num_sms answers
that. Every kernel is absent, so any other use fails with an AttributeError."""

import torch


def get_num_sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
