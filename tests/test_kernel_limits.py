"""Limits shared by the kernels and Python are written once, in csrc/kernel_limits.h."""

from mla_backend import config, xqa
from mla_backend.kernel_build import HEADERS
from mla_backend.kernel_limits import HEADER, csrc_dir, read_limits


def test_python_takes_its_limits_from_the_kernel_header():
    limits = read_limits(csrc_dir() / HEADER)
    assert limits == {"MAX_KV_SPLITS": xqa.MAX_KV_SPLITS, "TOKENS_PER_TILE": xqa.TOKENS_PER_TILE}
    assert config.MLABackendConfig.model_fields["num_kv_splits"].metadata[1].le == limits["MAX_KV_SPLITS"]


def test_the_kernels_use_the_header_and_its_edits_rebuild_them():
    kernel = (csrc_dir() / "mla_decode_kernel.cuh").read_text()
    assert "constexpr int kMaxSplits = MLA_MAX_KV_SPLITS;" in kernel
    assert "constexpr int kBlockN = MLA_TOKENS_PER_TILE;" in kernel
    assert HEADER in HEADERS  # part of the source stamp: a prebuilt library of other limits is not loaded
