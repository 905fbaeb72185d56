"""Every compute capability from 7.0 to 12.9 walks config -> route -> build: what the config sends to
the bundled kernels has a build target and a shipped library name, and nothing else does."""

import pytest

from mla_backend.config import BackendUnavailableError, MLABackendConfig
from mla_backend.kernel_build import arch_for_capability, library_filename, nvcc_flags
from mla_backend.route import resolve_route
from mla_backend.targets import ARCH_BY_CAPABILITY, SHIPPED_ARCHES, TRTLLM_GEN_CAPABILITIES

CAPABILITIES = [(major, minor) for major in range(7, 13) for minor in range(10)]


def route(backend: str, capability, has_flashinfer: bool) -> str:
    try:
        return resolve_route(MLABackendConfig(backend=backend), capability, has_flashinfer=has_flashinfer).kernel
    except BackendUnavailableError:
        return "refused"


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: f"{c[0]}.{c[1]}")
def test_capability_walks_config_route_build(capability):
    kernels = {route(backend, capability, fi) for backend in ("auto", "xqa", "trtllm-gen") for fi in (True, False)}
    assert kernels <= {"bundled", "trtllm-gen", "fallback", "refused"}
    if "bundled" in kernels:  # the config sends decode to the bundled kernels: a library must exist for it
        arch = arch_for_capability(capability)
        assert arch in SHIPPED_ARCHES
        assert library_filename(arch).endswith(f"{arch}.so")
        assert f"code={arch}" in " ".join(nvcc_flags(arch))
    else:
        with pytest.raises(RuntimeError, match="no mla_backend kernel target"):
            arch_for_capability(capability)
    if "trtllm-gen" in kernels:
        assert capability in TRTLLM_GEN_CAPABILITIES
    auto = route("auto", capability, False)
    assert auto == ("bundled" if capability in ARCH_BY_CAPABILITY else "fallback")


def test_every_build_target_is_reachable_from_the_config():
    routed = {c for c in CAPABILITIES if route("xqa", c, False) == "bundled"}
    assert routed == set(ARCH_BY_CAPABILITY)
    assert set(SHIPPED_ARCHES) == {arch_for_capability(c) for c in routed}


def test_each_gpu_gets_its_own_architecture():
    """Written out, not derived: a GB10 (12.1) given sm_120a's cubins would not load them (arch-specific
    "a" targets run on their exact capability only)."""
    assert ARCH_BY_CAPABILITY == {
        (8, 9): "sm_89",
        (9, 0): "sm_90a",
        (10, 0): "sm_100a",
        (10, 3): "sm_103a",
        (12, 0): "sm_120a",
        (12, 1): "sm_121a",
    }
    assert arch_for_capability((12, 1)) == "sm_121a" and arch_for_capability((12, 0)) == "sm_120a"
