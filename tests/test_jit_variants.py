"""Kernel build variants (config fp8_qk and fp8_pv): flags, build directories and stamps, no compiler."""

from typing import get_args

import pytest

from mla_backend.config import Fp8PvName, Fp8QkName, MLABackendConfig
from mla_backend.jit import build_dir, csrc_dir
from mla_backend.kernel_build import (
    F16_PV_ARCHES,
    F16_PV_DEFAULT_ARCHES,
    FP8_PV_CHOICES,
    FP8_QK_CHOICES,
    KernelVariant,
    library_filename,
    nvcc_flags,
    source_stamp,
)

WIDEN = "-DMLA_FP8_QK_VIA_F16"
PV_F16 = "-DMLA_FP8_PV_F16_ACC"
E4M3_QK, F16_PV, F32_PV = KernelVariant(fp8_qk="e4m3"), KernelVariant(fp8_pv="f16"), KernelVariant(fp8_pv="f32")


def test_build_module_knows_the_configs_choices():
    assert FP8_QK_CHOICES == get_args(Fp8QkName) and FP8_PV_CHOICES == get_args(Fp8PvName)


def test_the_config_names_its_variant():
    config = MLABackendConfig.from_sources(environ={"MLA_BACKEND_FP8_PV": "f16", "MLA_BACKEND_FP8_QK": "e4m3"})
    assert config.kernel_variant == KernelVariant("e4m3", "f16")
    assert MLABackendConfig.from_sources(environ={}).kernel_variant == KernelVariant()


def test_auto_widens_q_only_on_sm90_and_sums_pv_in_f16_only_on_sm120():
    assert KernelVariant().resolved("sm_90a") == KernelVariant("f16", "f32") and WIDEN in nvcc_flags("sm_90a")
    assert PV_F16 not in nvcc_flags("sm_90a")
    for arch in ("sm_89", "sm_100a", "sm_103a"):
        assert KernelVariant().resolved(arch) == KernelVariant("e4m3", "f32")
        assert WIDEN not in nvcc_flags(arch) and PV_F16 not in nvcc_flags(arch)
    assert F16_PV_DEFAULT_ARCHES == ("sm_120a", "sm_121a")
    for arch in F16_PV_DEFAULT_ARCHES:
        assert KernelVariant().resolved(arch) == KernelVariant("e4m3", "f16")
        assert WIDEN not in nvcc_flags(arch) and PV_F16 in nvcc_flags(arch)


def test_the_sm120_layout_builds_for_sm90_apart_from_the_default(tmp_path):
    assert WIDEN not in nvcc_flags("sm_90a", variant=E4M3_QK)
    default, e4m3 = build_dir("sm_90a", str(tmp_path)), build_dir("sm_90a", str(tmp_path), E4M3_QK)
    assert default.name == "sm_90a" and e4m3.name == "sm_90a-fp8qk-e4m3"
    assert build_dir("sm_90a", str(tmp_path), KernelVariant("f16", "f32")) == default  # the default spelled out
    assert library_filename("sm_90a", E4M3_QK) == "mla_backend_sm_90a_fp8qk_e4m3.so"
    spelled_out = library_filename("sm_90a", KernelVariant(fp8_qk="f16"))
    assert spelled_out == library_filename("sm_90a") == "mla_backend_sm_90a.so"
    assert source_stamp(csrc_dir(), "sm_90a", E4M3_QK) != source_stamp(csrc_dir(), "sm_90a")


def test_the_other_pv_sum_builds_apart_from_the_default_where_it_fits(tmp_path):
    for arch in F16_PV_ARCHES:
        other, name = (F32_PV, "f32") if arch in F16_PV_DEFAULT_ARCHES else (F16_PV, "f16")
        assert (PV_F16 in nvcc_flags(arch, variant=other)) == (name == "f16")
        assert (PV_F16 in nvcc_flags(arch)) == (name == "f32")
        assert build_dir(arch, str(tmp_path), other).name == f"{arch}-fp8pv-{name}"
        assert library_filename(arch, other) == f"mla_backend_{arch}_fp8pv_{name}.so"
        assert source_stamp(csrc_dir(), arch, other) != source_stamp(csrc_dir(), arch)
    both = KernelVariant("e4m3", "f16")
    assert library_filename("sm_90a", both) == "mla_backend_sm_90a_fp8qk_e4m3_fp8pv_f16.so"
    assert build_dir("sm_90a", str(tmp_path), both).name == "sm_90a-fp8qk-e4m3-fp8pv-f16"


def test_flags_target_the_oldest_supported_torch_abi():
    assert "-DTORCH_TARGET_VERSION=0x020b000000000000" in nvcc_flags("sm_120a")


def test_variants_are_refused_where_they_do_not_build():
    with pytest.raises(ValueError, match="sm_90a only"):
        nvcc_flags("sm_120a", variant=KernelVariant(fp8_qk="f16"))
    for arch in ("sm_89", "sm_100a", "sm_103a"):  # their 32-row kernel spills with f16 P.V
        with pytest.raises(ValueError, match="spills"):
            nvcc_flags(arch, variant=F16_PV)
    with pytest.raises(ValueError, match="fp8_qk must be one of"):
        KernelVariant("e5m2").resolved("sm_90a")
    with pytest.raises(ValueError, match="fp8_pv must be one of"):
        KernelVariant(fp8_pv="bf16").resolved("sm_90a")
