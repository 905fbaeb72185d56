"""Stand-in for DeepGEMM where it is not installed (the lent GPU's image): empty, so that importing it
works and any use fails with an AttributeError. SGLang 0.5.17's speculative decoding imports its
sparse-attention (DSA) backend while capturing the drafter's CUDA graphs, and that module imports
deep_gemm at load on CUDA; only a sparse model calls into it."""
