"""vLLM 0.26's LongCat-Flash target with its MTP layer's weights in the same checkpoint."""

from __future__ import annotations


def skip_longcat_mtp_weights_in_target() -> None:
    """vLLM 0.26's LongCat model skips the MTP layer's weights by ``".mtp." in name``, but its loader
    hands it names without the ``model.`` prefix (``mtp.embed_tokens.weight``), so loading stops on
    them (KeyError), whatever the attention backend; vLLM 0.33 skips ``name.startswith("mtp.")``
    (models/longcat_flash.py). The drafter (longcat_flash_mtp) reads them from the same files. Call it
    in each process that builds an engine (vllm_engine.SETUP_ENV for isolated ones)."""
    from vllm.model_executor.models.longcat_flash import FlashModel

    original = FlashModel.load_weights
    if getattr(original, "skips_mtp", False):
        return

    def load_weights(self, weights):
        return original(self, ((name, w) for name, w in weights if not name.startswith("mtp.")))

    load_weights.skips_mtp = True
    FlashModel.load_weights = load_weights
