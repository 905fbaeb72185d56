"""Command line: `python -m mla_backend {doctor,demo,build,bench}`."""

from __future__ import annotations

import argparse
import logging
from typing import get_args

from .config import Fp8PvName, Fp8QkName
from .kernel_build import KernelVariant


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mla_backend", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="versions, GPUs and which kernel serves decode, and why")
    doctor.add_argument(
        "--routes",
        action="store_true",
        help="print the route of each GPU type at a few shapes (docs/design.md's table)",
    )
    demo = sub.add_parser("demo", help="decode a small seeded DeepSeek-V3 through vLLM with the plugin")
    demo.add_argument("--heads", type=int, default=16)
    demo.add_argument("--batch", type=int, default=32)
    demo.add_argument("--context", type=int, default=2048)
    demo.add_argument("--new-tokens", type=int, default=128)
    build = sub.add_parser("build", help="build the CUDA kernels ahead of time (no GPU needed)")
    build.add_argument(
        "--arch", default=None, help="comma-separated targets, e.g. sm_90a,sm_120a (default: the visible GPU's)"
    )
    build.add_argument("--strict", action="store_true", help="fail on any register spill (CI)")
    build.add_argument(
        "--fp8-qk",
        choices=get_args(Fp8QkName),
        default="auto",
        help="FP8 QK^T variant (the fp8_qk setting); e4m3 on sm_90a builds the SM120 code path",
    )
    build.add_argument(
        "--fp8-pv",
        choices=get_args(Fp8PvName),
        default="auto",
        help="FP8 P.V accumulation (the fp8_pv setting); f16 sums each 16-token step in f16",
    )
    bench = sub.add_parser("bench", help="time the decode kernel against the peers importable here")
    bench.add_argument("--quick", action="store_true", help="a few shapes only")
    bench.add_argument(
        "--out", default="results/bench_decode", help="prefix of the JSON and PNG written (results/ is git-ignored)"
    )
    bench.add_argument(
        "--route-table",
        action="store_true",
        help="measure, per shape class, ours against vLLM's FlashMLA: the table auto routes by on SM90",
    )
    bench.add_argument("--write", action="store_true", help="with --route-table: store it in the installed package")
    bench.add_argument(
        "--token-indexed",
        action="store_true",
        help="time two shapes read through 64-token pages, one slot id a token, and FlashInfer's ragged ids",
    )
    bench.add_argument(
        "--sparse",
        action="store_true",
        help="time sparse decode (top-k 2048, fp8_ds_mla) against FlashMLA's sparse decode where vLLM ships it",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.command == "doctor":
        from .tools.doctor import main as doctor

        return doctor(routes=args.routes)
    if args.command == "demo":
        from .tools.demo import main as demo

        return demo(args.batch, args.context, args.new_tokens, args.heads)
    if args.command == "build":
        from .jit import build_cli

        return build_cli(args.arch, strict=args.strict, variant=KernelVariant(args.fp8_qk, args.fp8_pv))
    if args.token_indexed:
        from .tools.bench_token_indexed import main as token_indexed

        return token_indexed()
    if args.sparse:
        from .tools.bench_sparse import main as sparse_bench

        return sparse_bench()
    if args.route_table:
        from .tools.route_table import main as route_table

        return route_table(args.out, write=args.write)
    from .tools.bench import main as bench_main

    return bench_main(quick=args.quick, out_prefix=args.out)
