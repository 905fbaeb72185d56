"""Probe (CPU, no GPU): how Triton lays out the indexer kernels' tiles (mla_backend/indexer_triton.py) in
each orientation. With ``KEYS_MAJOR`` False the query rows (tokens x heads) are the tensor-core tile's M
and keys its N, and the sum over heads runs down M; with True keys are M and the (token, head) columns
N. Whether that sum crosses warps (Triton then goes through shared memory and a barrier each key block)
is read from the layout Triton gives the reduced tile. Both kernels are compiled by Triton's own ptxas
for sm_90a and sm_120a, with the wrappers' warps and tiles; registers and spills from Triton's cuobjdump.
What the orientation is for, not a speed claim: dev/indexer_vs_deepgemm.py --keys-major times it.

    python3 dev/indexer_tile_layout.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mla_backend import indexer_triton

POINTERS = {"q_ptr": "*fp8e4nv", "cache_ptr": "*u8", "k_ptr": "*fp8e4nv", "lens_ptr": "*i32", "table_ptr": "*i32"}
POINTERS |= {"starts_ptr": "*i32", "ends_ptr": "*i32", "weights_ptr": "*fp32", "scale_ptr": "*fp32", "out_ptr": "*fp32"}


def compiled(fn, constexprs: dict, capability: int, num_warps: int):
    signature = {n: POINTERS.get(n, "constexpr" if n in constexprs else "i32") for n in fn.arg_names}
    target = GPUTarget("cuda", capability, 32)
    return triton.compile(ASTSource(fn, signature, constexprs), target=target, options={"num_warps": num_warps})


def resources(cubin: bytes) -> tuple[int, int]:
    """Registers and spill stores of a cubin's kernel, as Triton's own cuobjdump reports them."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    spills = re.search(r"(\d+) bytes spill stores", usage)
    return int(regs.group(1)) if regs else -1, int(spills.group(1)) if spills else 0


def heads_across_warps(ttgir: str) -> bool | None:
    """Whether the float sum over the [.., heads, ..] tile spans warps: the warp bases of the linear
    layout of the tile it reduces move along the summed axis. None where the code has no such sum."""
    layouts = dict(re.findall(r"^(#linear\d*) = #ttg\.linear<\{(.*)\}>", ttgir, flags=re.M))
    for reduce in re.finditer(r'"tt\.reduce"\(%\w+\) <\{axis = (\d+)', ttgir):
        operand = ttgir[ttgir.index("}) : (", reduce.end()) :]
        tile = re.match(r"\}\) : \(tensor<\d+x\d+x\d+xf32, (#linear\d*)>", operand)
        if tile is None:  # the integer reductions over a program's row lengths
            continue
        warps = re.search(r"warp = (\[\[.*?\]\])", layouts[tile.group(1)])
        bases = eval(warps.group(1)) if warps else []  # noqa: S307 - a list of int lists from Triton's own dump
        return any(base[int(reduce.group(1))] for base in bases)
    return None


def cases() -> dict[str, tuple]:
    """(kernel, constexprs, warps) as the wrappers launch them: decode one token a request (64 or 32
    (token, head) rows: 4 warps), prefill tiles of (token, head) rows x keys (8 warps)."""
    paged = {"DIM": 128, "PAGE": 64, "DOT_DTYPE": None, "CAUSAL": True, "NEXT_N": 1, "GROUP": 1, "SLOTS": 1}
    found = {f"decode {h}h": (indexer_triton._paged_logits_kernel, {**paged, "HEADS": h}, 4) for h in (64, 32)}
    for heads in (64, 32):
        for rows, keys in ((128, 64), (128, 128), (256, 128)):
            ragged = {"DIM": 128, "DOT_DTYPE": None, "COMPRESSED": False, "HEADS": heads}
            constexprs = {**ragged, "SLOTS": rows // heads, "KEYS": keys}
            found[f"prefill {heads}h {rows}x{keys}"] = (indexer_triton._ragged_logits_kernel, constexprs, 8)
    return found


def main() -> int:
    print(f"{'case':22} {'sm':>4} {'orientation':12} {'regs':>5} {'spills':>6} {'smem B':>7}  heads summed")
    for name, (fn, constexprs, warps) in cases().items():
        for capability in (90, 120):
            for keys_major in (False, True):
                c = compiled(fn, {**constexprs, "KEYS_MAJOR": keys_major}, capability, warps)
                regs, spills = resources(c.asm["cubin"])
                across = {True: "across warps", False: "within a warp", None: "?"}[heads_across_warps(c.asm["ttgir"])]
                layout = "keys-major" if keys_major else "rows-major"
                print(f"{name:22} {capability:4} {layout:12} {regs:5} {spills:6} {c.metadata.shared:7}  {across}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
