"""The GPUs mla_backend serves: one table, read by the config (which kernel serves decode), the
kernel build (which nvcc target) and the wheel (which libraries it ships).

Standard library only: setup.py loads it, through kernel_build, before the package's dependencies exist.
"""

from __future__ import annotations

# compute capability -> the architecture the bundled kernels are built for ("a": arch-specific
# features such as setmaxnreg/wgmma on 9.0 and native FP8 QMMA on 12.x, which run on that exact
# capability only). The config sends decode to the bundled kernels on exactly these capabilities.
ARCH_BY_CAPABILITY: dict[tuple[int, int], str] = {
    (8, 9): "sm_89",  # Ada (L4, L40S, RTX 40xx): native FP8 mma.sync
    (9, 0): "sm_90a",  # Hopper (H100, H200)
    (10, 0): "sm_100a",  # B200, GB200
    (10, 3): "sm_103a",  # B300, GB300
    (12, 0): "sm_120a",  # RTX 50xx, RTX PRO 6000 Blackwell
    (12, 1): "sm_121a",  # GB10 (DGX Spark)
}
SHIPPED_ARCHES = tuple(ARCH_BY_CAPABILITY.values())

# Where FlashInfer's trtllm-gen MLA decode runs (SM100-class datacenter Blackwell).
TRTLLM_GEN_CAPABILITIES = frozenset({(10, 0), (10, 3)})


def bundled_arch(capability: tuple[int, int]) -> str | None:
    """The bundled kernels' build target for this capability, or None where they do not run."""
    return ARCH_BY_CAPABILITY.get((int(capability[0]), int(capability[1])))


def served_capabilities() -> str:
    """'8.9, 9.0, ...' for messages."""
    return ", ".join(f"{major}.{minor}" for major, minor in ARCH_BY_CAPABILITY)
