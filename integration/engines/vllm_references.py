"""vLLM's own MLA backends run as the references ours is judged against (settings.REFERENCES) and the
peers that calibrate the tie rule (settings.PEERS); a peer's run whose failure is recorded, not raised."""

from __future__ import annotations

from integration.engines.vllm_engine import run_engine, run_engine_isolated
from integration.engines.vllm_spec import EngineSpec
from integration.settings import PEERS, REFERENCES, SPEC_MAX_MODEL_LEN


def run_isolated_or_error(spec: EngineSpec, model: str, prompts: list[list[int]]) -> dict:
    """A peer's run; its failure is recorded, not raised (it only calibrates the judgement of ours)."""
    try:
        return run_engine_isolated(spec, model, prompts)
    except Exception as err:
        return {"name": spec.name, "error": repr(err)[:300]}


def reference_runs(
    model: str,
    prompts: list[list[int]],
    rows: list,
    kvs: set[str],
    spec_tokens: int = 0,
    repeats: int = 1,
    spec_method: str = "ngram",
    isolated: bool = False,
    draft_model: str | None = None,
) -> dict[str, dict]:
    """vLLM's own backends (the references and the calibration peers) for both KV dtypes, keyed by
    backend name + KV dtype; the references ``repeats`` times (``key#2`` ...). Speculative
    (compiled) engines each run in their own process, every engine does with ``isolated``."""
    refs = {}
    for kv in REFERENCES.keys() & kvs:
        for name in sorted(set(REFERENCES[kv]) | set(PEERS[kv])):
            spec = EngineSpec(
                name, kv, 64, True, spec_tokens=spec_tokens, spec_method=spec_method, draft_model=draft_model
            )
            runs = repeats if name in REFERENCES[kv] else 1
            for run in range(runs):
                key = name + kv + (f"#{run + 1}" if run else "")
                refs[key] = (
                    run_engine_isolated(spec, model, prompts, SPEC_MAX_MODEL_LEN if spec_tokens else 2048)
                    if spec_tokens or isolated
                    else run_engine(spec, model, prompts)
                )
            rows.append(reference_row(refs[name + kv]))
    return refs


def reference_row(ref: dict) -> tuple[str, str, str]:
    """A reference's own forward_mqa against float64, as a row of the run's table."""
    check = ref["decode_check"]
    errors = ", ".join(f"q_len {k}: {v:.1e}" for k, v in check["max_rel_error"].items())
    return (
        ref["name"],
        "reference",
        f"its forward_mqa vs float64: {errors or 'not checked'} "
        f"({check['checked_calls']} calls, {check['checked_graph_calls']} replayed) "
        f"{check['check_problems'] or ''}",
    )
