// The checks the binding keeps. Inputs are validated in Python before any launch (mla_backend/checks.py,
// the launcher, the step plan); the library checks only what memory safety depends on (a kernel would
// read or write out of bounds, or the launch would fail, without it), each with MLA_INVARIANT.
#pragma once

#include <cuda_runtime.h>
#include <torch/headeronly/util/Exception.h>

// A memory-safety invariant of the kernels: fails the op (a RuntimeError in Python) before any launch.
#define MLA_INVARIANT(cond, ...) STD_TORCH_CHECK(cond, "mla_backend: memory-safety invariant: ", __VA_ARGS__)

#define MLA_CUDA_CHECK(call)                                                                                         \
  do {                                                                                                               \
    const cudaError_t mla_status = (call);                                                                           \
    STD_TORCH_CHECK(mla_status == cudaSuccess, "mla_backend: ", #call, " failed: ", cudaGetErrorString(mla_status)); \
  } while (0)
