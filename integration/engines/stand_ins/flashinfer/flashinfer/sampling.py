"""The sampling names SGLang 0.5.17 imports (see the package docstring); it samples with pytorch here."""

from . import _absent as min_p_sampling_from_probs
from . import _absent as top_k_top_p_sampling_from_probs

__all__ = ["min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs"]
