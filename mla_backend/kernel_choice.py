"""Which kernel serves decode on a device: the one decision the op's calls and the step plan share."""

from __future__ import annotations

import torch

from .config import BackendName, BackendUnavailableError, MLABackendConfig, resolve_backend


def resolve_kernel(
    device: torch.device, config: MLABackendConfig, backend: BackendName = "auto"
) -> tuple[MLABackendConfig, str]:
    """(settings with ``backend`` applied, the kernel that serves ``device``: reference/bundled/trtllm-gen).

    Raises ``BackendUnavailableError`` where no kernel serves the GPU, as FlashInfer does on a GPU it has
    no kernel for.
    """
    if backend != "auto":
        config = config.model_copy(update={"backend": MLABackendConfig(backend=backend).backend})
    if device.type != "cuda":
        return config, "reference"
    resolution = resolve_backend(config, config.capability(torch.cuda.get_device_capability(device)))
    if resolution.kernel == "fallback":
        raise BackendUnavailableError(
            f"no MLA decode kernel here: {resolution.reason}. The vLLM plugin serves such GPUs with vLLM's "
            "Triton MLA; the op runs the float64 reference on CPU tensors"
        )
    return config, resolution.kernel
