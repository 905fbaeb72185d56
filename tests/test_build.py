"""Ahead-of-time build of csrc/ for SM90 and SM120 on a machine without a GPU (the CI compile
check), with the properties the design depends on read off the machine code and the library."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mla_backend.jit import build_dir
from mla_backend.kernel_build import library_filename

pytestmark = pytest.mark.build

ARCHES = ("sm_90a", "sm_120a")
PROFILES = Path(__file__).resolve().parents[1] / "dev" / "profiles"


def cuda_tool(name: str) -> str:
    """cuobjdump/nvdisasm from PATH, CUDA_HOME or the nvidia-cuda-* wheels of the test extra."""
    import nvidia

    candidates = [shutil.which(name), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)]
    candidates += [str(Path(p) / "cu13" / "bin" / name) for p in nvidia.__path__]
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{name} not found: pip install nvidia-cuda-{name}")


@pytest.fixture(scope="module")
def built(kernel_cache):
    cache = kernel_cache
    env = dict(os.environ, MLA_BACKEND_CACHE_DIR=str(cache))
    result = subprocess.run(
        [sys.executable, "-m", "mla_backend", "build", "--arch", ",".join(ARCHES), "--strict"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"build failed (spills count as failures):\n{result.stdout}\n{result.stderr[-4000:]}"
    return {arch: build_dir(arch, str(cache)) / library_filename(arch) for arch in ARCHES}


def sass(library: Path) -> str:
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(cuda_tool("nvdisasm")))  # cuobjdump calls it
    result = subprocess.run(
        [cuda_tool("cuobjdump"), "--dump-sass", str(library)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_both_arches_build_without_spills(built):
    for arch, library in built.items():
        assert library.is_file(), arch
        assert (library.parent / "source.sha256").is_file()


def test_sm120_fp8_kernels_use_native_qmma(built):
    code = sass(built["sm_120a"])
    assert re.search(r"QMMA\.16832\.F32\.E4M3\.E4M3", code), "FP8 QK^T must be native QMMA on sm_120a"
    assert "HMMA.16816.F32.BF16" in code  # the BF16 kernels


def test_no_local_memory_in_kernels(built):
    for arch, library in built.items():
        code = sass(library)
        assert not re.search(r"\b(LDL|STL)\b", code), f"local memory traffic in {arch} kernels"


def test_library_has_no_python_dependency(built):
    """No pybind: the .so must not link libpython (one build serves every Python)."""
    for library in built.values():
        assert_no_python_dependency(library)


def test_library_uses_only_torchs_stable_abi(built):
    for library in built.values():
        assert_only_stable_torch_abi(library)


def test_library_registers_its_ops_in_a_fresh_process(built):
    for arch, library in built.items():
        assert_registers_ops(library, ds_mla_on_fp8_tiles=arch == "sm_90a")


def assert_no_python_dependency(library: Path) -> None:
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    assert "libpython" not in needed
    assert "PyInit_" not in subprocess.run(["nm", "-D", str(library)], capture_output=True, text=True).stdout


def assert_only_stable_torch_abi(library: Path) -> None:
    """Undefined symbols from torch are the C shim's (aoti_torch_*, torch_*), never C++ ones of
    c10/ATen/torch, whose ABI changes between releases; CUDA's runtime is linked in statically."""
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True).stdout
    assert "aoti_torch_get_current_cuda_stream" in undefined
    unstable = re.findall(r"\b(_ZN(?:3c10|2at|5torch)\w+)", undefined)
    assert not unstable, f"{library.name} uses torch's unstable C++ ABI: {unstable[:5]}"
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    assert "libcudart" not in needed and "libc10" not in needed


OP_CHECK = """
import sys, torch
torch.ops.load_library(sys.argv[1])
ops = torch.ops.mla_backend
for op in (ops.decode, ops.ctas_per_sm, ops.plan_ints, ops.workspace_bytes, ops.num_splits, ops.schedule):
    print(op.default._schema)
print("schedule", ops.schedule(128, 16, True, 16384, 264, 1 << 40, False))
from mla_backend.launcher import tile_shape
print("ds_mla_fp8_tile", [ops.ds_mla_fp8_tile(*tile_shape(rows, True)) for rows in (8, 16, 17, 128)])
"""


def assert_registers_ops(library: Path, ds_mla_on_fp8_tiles: bool) -> None:
    """The ops register in a fresh process, and the scheduling ones run there without a GPU: fp8_ds_mla
    rows of more than 16 heads on the FP8 tile where the build has one (sm_90a), never at 16 or fewer."""
    result = subprocess.run([sys.executable, "-c", OP_CHECK, str(library)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mla_backend::decode(Tensor q_nope, Tensor q_pe" in result.stdout
    assert "mla_backend::ctas_per_sm(bool fp8, int row_groups, int rf, int kv_format) -> int" in result.stdout
    assert "mla_backend::schedule(int batch, int rows, bool fp8, int max_seq_len, int slots" in result.stdout
    assert "schedule (1, 264)" in result.stdout  # 128 requests plan on the GPU: one wave of 264 pieces
    fp8_tile = ds_mla_on_fp8_tiles
    assert f"ds_mla_fp8_tile [False, False, {fp8_tile}, {fp8_tile}]" in result.stdout


def test_sm120_sums_fp8_pv_in_f16_by_default_and_in_f32_on_request(built, tmp_path):
    """sm_120a's default: the FP8 P.V MMAs accumulate in f16 (HMMA.16816.F16) next to native QMMA for
    QK^T, without spills; fp8_pv="f32" builds apart (strict) with f32 accumulation only; sm_90a sums
    in f32."""
    from mla_backend.kernel_build import KernelVariant

    default = sass(built["sm_120a"])
    assert re.search(r"HMMA\.16816\.F16\b", default) and re.search(r"QMMA\.16832\.F32\.E4M3\.E4M3", default)
    assert not re.search(r"HMMA\.16816\.F16\b", sass(built["sm_90a"]))
    env = dict(os.environ, MLA_BACKEND_CACHE_DIR=str(tmp_path))
    command = [sys.executable, "-m", "mla_backend", "build", "--arch", "sm_120a", "--fp8-pv", "f32", "--strict"]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"build failed (spills count as failures):\n{result.stderr[-4000:]}"
    variant = KernelVariant(fp8_pv="f32")
    code = sass(build_dir("sm_120a", str(tmp_path), variant) / library_filename("sm_120a", variant))
    assert not re.search(r"HMMA\.16816\.F16\b", code) and re.search(r"QMMA\.16832\.F32\.E4M3\.E4M3", code)
    assert not re.search(r"\b(LDL|STL)\b", code)


def kernels(code: str) -> dict[str, str]:
    """cuobjdump's SASS cut into one entry per kernel, keyed by the (mangled) function name."""
    parts = re.split(r"^\s*Function : (\S+)\s*$", code, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


WS_16_ROWS = "_ZN3mla20mla_decode_ws_kernelINS_10TileConfigILb1ELi1ELi1ELNS_8KvFormatE0EEEEEvNS_12DecodeParamsE"
WS_32_ROWS = "_ZN3mla20mla_decode_ws_kernelINS_10TileConfigILb1ELi1ELi2ELNS_8KvFormatE0EEEEEvNS_12DecodeParamsE"
WS_BF16_16_ROWS = "_ZN3mla20mla_decode_ws_kernelINS_10TileConfigILb0ELi1ELi1ELNS_8KvFormatE0EEEEEvNS_12DecodeParamsE"
WS_BF16_32_ROWS = "_ZN3mla20mla_decode_ws_kernelINS_10TileConfigILb0ELi2ELi1ELNS_8KvFormatE0EEEEEvNS_12DecodeParamsE"
# mla_decode_kernel<fp8, row groups, fragments, KvFormat>: plain rows (0), fp8_ds_mla rows (1).
V1_FP8_16_ROWS = "_ZN3mla17mla_decode_kernelILb1ELi1ELi1ELNS_8KvFormatE0EEEvNS_12DecodeParamsE"
V1_FP8_32_ROWS = "_ZN3mla17mla_decode_kernelILb1ELi1ELi2ELNS_8KvFormatE0EEEvNS_12DecodeParamsE"
V1_BF16_16_ROWS = "_ZN3mla17mla_decode_kernelILb0ELi1ELi1ELNS_8KvFormatE0EEEvNS_12DecodeParamsE"
V1_BF16_32_ROWS = "_ZN3mla17mla_decode_kernelILb0ELi2ELi1ELNS_8KvFormatE0EEEvNS_12DecodeParamsE"
V1_DS_MLA = [  # the fp8_ds_mla tiles (BF16 at 16 and 32 rows): v1 on every architecture
    "_ZN3mla17mla_decode_kernelILb0ELi1ELi1ELNS_8KvFormatE1EEEvNS_12DecodeParamsE",
    "_ZN3mla17mla_decode_kernelILb0ELi2ELi1ELNS_8KvFormatE1EEEvNS_12DecodeParamsE",
]
# sm_90a's FP8 32-row tile over raw fp8_ds_mla rows (f16 Q): latent products in f16, rope in bf16.
V1_FP8_DS_MLA = "_ZN3mla17mla_decode_kernelILb1ELi1ELi2ELNS_8KvFormatE1EEEvNS_12DecodeParamsE"


def test_sm120_runs_every_tile_on_the_warp_specialized_kernel(built):
    """On sm_120a (one CTA per SM) every tile of plain rows, FP8 at 16 and 32 rows and BF16 at 16 and at
    32 (two row groups), is the warp-specialized kernel: FP8 QK^T on native QMMA and P.V on
    f16-accumulating HMMA, BF16 both on HMMA with fp32 sums; handed over through mbarriers, the KV
    loaded by a warpgroup of its own that hands its registers to the others. The only v1 instances
    there are the fp8_ds_mla tiles (their rows convert in registers, which the loader warpgroup lacks).
    sm_90a keeps v1's (two CTAs per SM) and builds no warp-specialized kernel."""
    sm120 = kernels(sass(built["sm_120a"]))
    ws = {name: code for name, code in sm120.items() if "mla_decode_ws_kernel" in name}
    assert sorted(ws) == sorted([WS_16_ROWS, WS_32_ROWS, WS_BF16_16_ROWS, WS_BF16_32_ROWS])
    for name, code in ws.items():
        if name in (WS_BF16_16_ROWS, WS_BF16_32_ROWS):
            assert re.search(r"HMMA\.16816\.F32\.BF16", code) and not re.search(r"QMMA|HMMA\.16816\.F16\b", code)
        else:
            assert re.search(r"QMMA\.16832\.F32\.E4M3\.E4M3", code) and re.search(r"HMMA\.16816\.F16\b", code)
        assert re.search(r"\bSYNCS\.", code), "P and the rescale factors are handed over through mbarriers"
        assert re.search(r"\bARRIVES\.LDGSTSBAR\b", code), "the loader's copies arrive on the stage's mbarrier"
        assert re.search(r"USETMAXREG\.DEALLOC", code) and re.search(r"USETMAXREG\.TRY_ALLOC", code), "registers traded"
        assert not re.search(r"\b(LDL|STL)\b", code)
    assert sorted(name for name in sm120 if name.startswith("_ZN3mla17mla_decode_kernel")) == sorted(V1_DS_MLA)
    sm90 = kernels(sass(built["sm_90a"]))
    assert {V1_FP8_16_ROWS, V1_FP8_32_ROWS, V1_BF16_16_ROWS, V1_BF16_32_ROWS, *V1_DS_MLA, V1_FP8_DS_MLA} <= set(sm90)
    assert not [name for name in sm90 if "mla_decode_ws_kernel" in name]
    assert V1_FP8_DS_MLA not in sm120, "sm_120a reads fp8_ds_mla rows with its BF16 tiles only"


def test_sm90_reads_fp8_ds_mla_rows_on_its_fp8_tile_with_f16_latent_and_bf16_rope_products(built):
    """sm_90a's FP8 32-row tile over raw fp8_ds_mla rows: QK^T's latent steps on e4m3 widened to f16
    (F2FP from E4M3 feeding HMMA.16816.F32), the rope step on bf16 HMMA, V scaled in f16 (HMUL2),
    cp.async copies of the rows (LDGSTS), no local memory."""
    code = kernels(sass(built["sm_90a"]))[V1_FP8_DS_MLA]
    assert re.search(r"HMMA\.16816\.F32\.BF16", code) and re.search(r"HMMA\.16816\.F32\b(?!\.BF16)", code)
    assert re.search(r"\bHMUL2\b", code) and re.search(r"\bLDGSTS\b", code)
    assert not re.search(r"\b(LDL|STL)\b", code)


def test_the_sm120_dev_profile_builds_sm120s_kernels_for_sm_90a(tmp_path):
    """dev/profiles/sm120_on_sm90.h (force-included through NVCC_APPEND_FLAGS, the dev workflow that
    runs SM120's build on a Hopper GPU) gives sm_90a SM120's choice: the four warp-specialized
    instances and v1 only for the fp8_ds_mla tiles, with SM120's FP8 variant (native e4m3 QK^T, P.V summed in f16)."""
    profile = PROFILES / "sm120_on_sm90.h"
    env = dict(os.environ, MLA_BACKEND_CACHE_DIR=str(tmp_path), NVCC_APPEND_FLAGS=f"-include {profile}")
    command = [sys.executable, "-m", "mla_backend", "build", "--arch", "sm_90a", "--fp8-qk", "e4m3", "--fp8-pv", "f16"]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    from mla_backend.kernel_build import KernelVariant

    variant = KernelVariant("e4m3", "f16")
    code = kernels(sass(build_dir("sm_90a", str(tmp_path), variant) / library_filename("sm_90a", variant)))
    ws = sorted(name for name in code if "mla_decode_ws_kernel" in name)
    assert ws == sorted([WS_16_ROWS, WS_32_ROWS, WS_BF16_16_ROWS, WS_BF16_32_ROWS])
    assert sorted(name for name in code if name.startswith("_ZN3mla17mla_decode_kernel")) == sorted(V1_DS_MLA)
    assert re.search(r"USETMAXREG\.DEALLOC", code[WS_32_ROWS])
