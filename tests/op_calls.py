"""Hypothesis strategies that draw decode calls around a served one and bend them, for the property
tests (tests/test_op_properties.py); whether a drawn call is served is for op_contract.violations.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st
from op_contract import (
    CHUNK_BYTES,
    ENTRIES,
    HEAD_DIM,
    JUNK_PAGE_IDS,
    LATENT,
    MAX_Q_LEN,
    NAN,
    NOPE_HEAD_DIMS,
    QUERY_NAMES,
    ROPE,
    SERVED_DTYPES,
    SERVED_PAGE_SIZES,
    Case,
    is_int,
    pages_view,
)

# ---------------------------------------------------------------------------------------------------
# Drawing calls


def poisoned(shape, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.full(shape, NAN if dtype.is_floating_point else 0, dtype=dtype, device=device)


def laid_out(values: torch.Tensor, layout: str, pad: int, swap: tuple[int, int]) -> torch.Tensor:
    """``values`` in ``layout``; storage the view leaves out is NaN, so reading it shows in the result."""
    shape, dim, device = values.shape, values.shape[-1], values.device
    if layout == "contiguous":
        return values.clone()
    if layout == "padded_rows":  # rows dim + pad elements apart
        buf = poisoned((*shape[:-1], dim + pad), values.dtype, device)
        buf[..., :dim] = values
        return buf[..., :dim]
    if layout == "offset":  # starting pad elements into its buffer
        buf = poisoned((values.numel() + pad,), values.dtype, device)
        view = buf[pad:].view(shape)
        view.copy_(values)
        return view
    if layout == "swapped":  # two leading dims swapped in storage (heads-major query, page-major cache)
        return values.transpose(*swap).contiguous().transpose(*swap)
    if layout == "broadcast":  # one leading dim of stride 0 (every head, or every page, the same)
        index = [slice(None)] * values.dim()
        index[swap[1]] = slice(0, 1)
        return values[tuple(index)].expand(shape)
    if layout == "strided_last":  # elements two apart
        buf = poisoned((*shape[:-1], 2 * dim), values.dtype, device)
        buf[..., ::2] = values
        return buf[..., ::2]
    if layout == "last_swapped":  # the last dim strided by the size of the one before
        return values.transpose(-1, -2).contiguous().transpose(-1, -2)
    raise AssertionError(layout)


# Layouts the contract serves, with pads of whole 16-byte chunks; and three faults of each part's
# layout: a misaligned start, misaligned row strides (8 elements align bf16 rows, not fp8 ones), a
# last dim that is not contiguous.
SERVED_LAYOUTS = ("contiguous", "swapped", "broadcast", "padded_rows", "offset")
PADS = (1, 4, 8, 12)


def layouts(pick, dtype: torch.dtype, part: str):
    chunk = CHUNK_BYTES // dtype.itemsize
    odd_pads = [p for p in PADS if p % chunk]
    faults = {
        "start": st.tuples(st.just("offset"), st.sampled_from(odd_pads)),
        "strides": st.tuples(st.just("padded_rows"), st.sampled_from(odd_pads)),
        "last dim": st.tuples(st.sampled_from(["strided_last", "last_swapped"]), st.just(0)),
    }
    served = st.tuples(st.sampled_from(SERVED_LAYOUTS), st.sampled_from([0, chunk, 2 * chunk]))
    return pick(f"{part} layout", served, faults, one_in=5)


@st.composite
def mostly(draw, valid, invalid, one_in: int = 10):
    """``valid``, or ``invalid`` one draw in ``one_in`` (shrinking towards ``valid``)."""
    return draw(invalid if draw(st.integers(0, one_in - 1)) == one_in - 1 else valid)


def vllm_query_layout(query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The query as vLLM's MLA hands it over: q_nope a transposed [H, B*q_len, 512] bmm output, q_pe a
    slice of the [B*q_len, H, 192] projection (head stride 192); the rest of the projection is NaN."""
    batch, q_len, heads, _ = query.shape
    flat = query.reshape(batch * q_len, heads, HEAD_DIM)
    nope = flat[..., :LATENT].transpose(0, 1).contiguous().transpose(0, 1)
    projection = poisoned((batch * q_len, heads, 128 + ROPE), query.dtype, query.device)
    projection[..., 128:] = flat[..., LATENT:]
    return nope.view(batch, q_len, heads, LATENT), projection[..., 128:].view(batch, q_len, heads, ROPE)


@st.composite
def calls(draw, device: str, other: str, max_len: int = 40, modes=("served", "one fault", "wild"), faults=None) -> Case:
    """A decode call on ``device`` (``other``: a device not to mix in), drawn in one of three modes:
    "served" (supported sizes and layouts, buffers of the right kinds), "one fault" (such a call with
    one of ``faults``: an unsupported size or layout, or a bent argument; half the draws) and "wild"
    (each size and layout unsupported one draw in ten or five, and up to two bent arguments)."""
    device_, other_ = torch.device(device), torch.device(other)
    mode = draw(st.sampled_from(modes if len(modes) == 1 else ("one fault",) + modes))  # one fault: half
    fault = draw(st.sampled_from(faults or FAULTS)) if mode == "one fault" else None

    def pick(name, valid, variants: dict, one_in=10):
        """``name``'s draw: the fault's variant when it is the one fault, any variant one draw in
        ``one_in`` when wild, else ``valid``."""
        if mode == "wild":
            return mostly(valid, st.one_of(*variants.values()), one_in)
        return variants[fault[1]] if fault and fault[0] == name else valid

    def size(name, valid):
        return pick(name, valid, {variant: st.just(value) for variant, value in SIZE_FAULTS[name].items()})

    dtype = draw(st.sampled_from(SERVED_DTYPES))
    heads = draw(size("heads", st.sampled_from([1, 2, 3, 4, 8, 16, 128])))
    q_len = draw(size("q_len", st.integers(1, MAX_Q_LEN)))
    page = draw(size("page size", st.sampled_from(SERVED_PAGE_SIZES[:8])))  # to 128: the oracle stays quick
    batch = draw(mostly(st.integers(1, 3), st.just(0), one_in=12))
    if heads * max(q_len, 1) > 64:  # keep the naive oracle quick
        batch, max_len = min(batch, 1), 8
    # lengths of 0 (no key: zero rows, LSE -inf) and below q_len (the first tokens see none) included
    length = mostly(st.one_of(st.integers(1, max_len), st.integers(max_len // 2, max_len)), st.just(0), one_in=6)
    seq_lens = draw(st.lists(length, min_size=batch, max_size=batch))

    # the paged cache and a shuffled block table with junk past each request's pages
    used = [-(-n // page) for n in seq_lens]
    width = max(used, default=0) + draw(st.integers(0, 2))
    num_pages = sum(used) + draw(st.integers(0, 2))
    order = draw(st.permutations(range(num_pages)))
    junk = draw(
        st.lists(st.sampled_from(JUNK_PAGE_IDS + (0, num_pages)), min_size=batch * width, max_size=batch * width)
    )
    table = [junk[b * width : (b + 1) * width] for b in range(batch)]
    cursor = 0
    for b, n in enumerate(used):
        table[b][:n] = order[cursor : cursor + n]
        cursor += n
    longest = max(seq_lens, default=0)
    max_seq_len = longest + draw(st.integers(0, width * page - longest))

    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q_values = torch.randn(batch, q_len, heads, HEAD_DIM, generator=gen).to(dtype).to(device_)
    kv_values = torch.randn(num_pages, page, HEAD_DIM, generator=gen).to(dtype).to(device_)

    steps = [f"mode: {mode}" + (f" ({fault[0]}: {fault[1]})" if fault else "")]
    split_fault = fault is not None and fault[0] == "split keywords"  # needs a pair passed by keyword
    query_form = draw(
        st.sampled_from(
            ["pair of views", "pair", "vllm"] if split_fault else ["whole", "pair of views", "pair", "vllm"]
        )
    )
    if query_form == "vllm":
        query = vllm_query_layout(q_values)
        steps.append("query: vLLM's split layout")
    elif query_form == "pair":
        (l1, p1), (l2, p2) = draw(layouts(pick, dtype, "query")), draw(layouts(pick, dtype, "query"))
        query = (
            laid_out(q_values[..., :LATENT].contiguous(), l1, p1, (1, 2)),
            laid_out(q_values[..., LATENT:].contiguous(), l2, p2, (1, 2)),
        )
        steps.append(f"query: pair, q_nope {l1} (pad {p1}), q_pe {l2} (pad {p2})")
    else:
        layout, pad = draw(layouts(pick, dtype, "query"))
        whole = laid_out(q_values, layout, pad, (1, 2))
        query = whole if query_form == "whole" else (whole[..., :LATENT], whole[..., LATENT:])
        steps.append(f"query: {query_form}, {layout} (pad {pad})")

    if isinstance(query, tuple) and draw(st.integers(0, 4)) == 0:
        query = list(query)  # a list is a pair too
        steps[-1] += ", as a list"

    kv_form = draw(st.sampled_from(["whole", "whole 4-D", "pair of views", "pair"]))
    four_d = draw(st.booleans())
    if kv_form == "pair":
        (l1, p1), (l2, p2) = draw(layouts(pick, dtype, "kv_cache")), draw(layouts(pick, dtype, "kv_cache"))
        kv_cache = (
            laid_out(kv_values[..., :LATENT].contiguous(), l1, p1, (0, 1)),
            laid_out(kv_values[..., LATENT:].contiguous(), l2, p2, (0, 1)),
        )
        if four_d:
            kv_cache = (kv_cache[0].unsqueeze(1), kv_cache[1])
        steps.append(f"kv_cache: pair, ckv {l1} (pad {p1}){' 4-D' * four_d}, kpe {l2} (pad {p2})")
    else:
        layout, pad = draw(layouts(pick, dtype, "kv_cache"))
        whole = laid_out(kv_values, layout, pad, (0, 1))
        if kv_form == "whole 4-D":
            whole = whole.unsqueeze(1)
        kv_cache = whole if kv_form.startswith("whole") else (whole[..., :LATENT], whole[..., LATENT:])
        steps.append(f"kv_cache: {kv_form}, {layout} (pad {pad})")

    if isinstance(kv_cache, tuple) and draw(st.integers(0, 4)) == 0:
        kv_cache = list(kv_cache)
        steps[-1] += ", as a list"

    bt_values = torch.tensor(table, dtype=torch.int32).reshape(batch, width).to(device_)
    bt_layout = draw(size("block_tables layout", st.sampled_from(["contiguous", "column slice"])))
    if bt_layout == "column slice":
        block_tables = torch.cat([bt_values, bt_values.new_full((batch, 3), -7)], dim=1)[:, :width]
    elif bt_layout == "transposed":
        block_tables = bt_values.t().contiguous().t()
    elif bt_layout == "every other column":
        block_tables = torch.stack([bt_values, bt_values], dim=-1).flatten(1)[:, ::2]
    else:
        block_tables = bt_values
    steps.append(f"block_tables: {bt_layout}")
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device_)
    if draw(size("seq_lens layout", st.just(False))):
        seq_lens_t = torch.stack([seq_lens_t, seq_lens_t.neg()], dim=-1)[:, 0]
        steps.append("seq_lens: every other element")

    entry = "batch_mla" if split_fault else draw(st.sampled_from(ENTRIES))
    rows = (batch, q_len, heads)
    out_kind = draw(st.sampled_from(["none", "4-D", "3-D"]))
    out = None
    if out_kind == "4-D" or (out_kind == "3-D" and q_len != 1):
        out = poisoned((*rows, LATENT), torch.bfloat16, device_)
    elif out_kind == "3-D":
        out = poisoned((batch, heads, LATENT), torch.bfloat16, device_)
    lse_kind = draw(st.sampled_from(["none", "rows", "flat", "strided rows"]))
    lse = {
        "none": lambda: None,
        "rows": lambda: poisoned(rows, torch.float32, device_),
        "flat": lambda: poisoned((batch * q_len, heads), torch.float32, device_),
        "strided rows": lambda: poisoned((batch, heads, q_len), torch.float32, device_).transpose(1, 2),
    }[lse_kind]()
    scales = mostly(
        st.sampled_from([0.06, 1 / math.sqrt(192), 0.02, 1.5]),
        st.one_of(
            st.sampled_from([0, 1]),  # Python ints are numbers too
            st.sampled_from([(1,), (), (1, 1)]).map(
                lambda shape: torch.full(shape, 0.05, dtype=torch.float32, device=device_)
            ),
        ),
        one_in=3,
    )
    case = Case(
        entry=entry,
        device=device_,
        other=other_,
        query=query,
        kv_cache=kv_cache,
        block_tables=block_tables,
        seq_lens=seq_lens_t,
        max_seq_len=max_seq_len,
        workspace=torch.zeros(1 << 10, dtype=torch.uint8, device=device_) if draw(st.booleans()) else None,
        out=out,
        lse=lse,
        bmm1=draw(scales),
        bmm2=draw(scales),
        qk_nope_head_dim=draw(st.sampled_from(NOPE_HEAD_DIMS)),
        return_lse=draw(st.booleans()),
        lse_base=None if entry == "mla_decode" else draw(st.sampled_from([None, "base2", "basee"])),
        split_keywords=entry == "batch_mla" and (split_fault or draw(st.booleans())),
        steps=steps,
    )
    bends = [fault] if fault and fault[0] in BENDS else []
    if mode == "wild":
        bends = draw(st.lists(st.sampled_from(BEND_FAULTS), max_size=2))
    for name, variant in bends:
        case.steps.append(f"{name} ({variant}): {BENDS[name][0](draw, case, variant)}")
    return case


# Bends: each changes one argument of a drawn call (in place), the way its variant ``how`` names, and
# says what it did. Whether the call is still served is for ``violations`` to say: some bends keep it
# valid (a dtype bent to the other served one, a page id bent into range).

DTYPES_BY_NAME = {
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp8 e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "bf16": torch.bfloat16,
    "fp8 e4m3": torch.float8_e4m3fn,
}
NOTHING = "an earlier bend left nothing to bend"


def query_tensors(case) -> bool:
    """The query is still a tensor or a pair of tensors (a bend that needs one can apply)."""
    q = case.query
    if isinstance(q, (tuple, list)):
        return len(q) == 2 and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in q)
    return isinstance(q, torch.Tensor) and q.dim() == 4


def kv_tensors(case) -> bool:
    """The cache is still a [P, page, D] (or [P, 1, page, D]) tensor or a pair of them."""
    paged = lambda t: isinstance(t, torch.Tensor) and (t.dim() == 3 or (t.dim() == 4 and t.shape[1] == 1))  # noqa: E731
    kv = case.kv_cache
    return len(kv) == 2 and all(map(paged, kv)) if isinstance(kv, (tuple, list)) else paged(kv)


def parts_of(x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(latent part, rope part, the whole tensor or else the latent part) of a tensor or a pair."""
    if isinstance(x, torch.Tensor):
        return x[..., :LATENT], x[..., LATENT:], x
    return x[0], x[1], x[0]


def rows_of(case) -> tuple[int, int, int] | None:
    q = case.query
    lead = q[0] if isinstance(q, (tuple, list)) and q and isinstance(q[0], torch.Tensor) else q
    return tuple(lead.shape[:3]) if isinstance(lead, torch.Tensor) and lead.dim() >= 3 else None


def bend_query_dtype(draw, case, how):
    if not query_tensors(case):
        return NOTHING
    dtype = DTYPES_BY_NAME[how]
    if isinstance(case.query, (tuple, list)):
        which = draw(st.sampled_from([0, 1]))
        parts = list(case.query)
        parts[which] = parts[which].to(dtype)
        case.query = tuple(parts)
        return f"{QUERY_NAMES[which + 1]} to {dtype}"
    case.query = case.query.to(dtype)
    return f"to {dtype}"


def bend_kv_dtype(draw, case, how):
    if not kv_tensors(case):
        return NOTHING
    dtype, kv = DTYPES_BY_NAME[how], case.kv_cache
    if isinstance(kv, (tuple, list)):
        both = draw(st.booleans())
        case.kv_cache = (kv[0].to(dtype), kv[1].to(dtype) if both else kv[1])
        return f"{'both parts' if both else 'ckv_cache'} to {dtype}"
    case.kv_cache = kv.to(dtype)
    return f"to {dtype}"


def bend_both_dtypes(draw, case, how):
    """Query and cache in one dtype, served or not (an fp16 or fp32 model, fp8 e5m2)."""
    if not (query_tensors(case) and kv_tensors(case)):
        return NOTHING
    dtype = DTYPES_BY_NAME[how]
    to = lambda x: tuple(t.to(dtype) for t in x) if isinstance(x, (tuple, list)) else x.to(dtype)  # noqa: E731
    case.query, case.kv_cache = to(case.query), to(case.kv_cache)
    return f"both to {dtype}"


def bend_query_shape(draw, case, how):
    if not query_tensors(case):
        return NOTHING
    nope, pe, whole = parts_of(case.query)
    pair = isinstance(case.query, (tuple, list))
    if how == "last dim":
        made = {
            "pe dim 32": lambda: (nope, pe[..., :32]),
            "nope dim 256": lambda: (nope[..., :256], pe),
            "whole dim 512": lambda: whole[..., :512].contiguous(),
            "whole dim 575": lambda: whole[..., :575].contiguous(),
            "whole dim 640": lambda: torch.cat([whole, whole[..., :64]], dim=-1),
        }
        choice = draw(st.sampled_from(list(made)[:2] if pair else list(made)[2:]))
    elif how == "rank":
        made = {
            "3-D parts": lambda: (nope.flatten(1, 2), pe.flatten(1, 2)),
            "3-D": lambda: whole.flatten(1, 2),
            "5-D": lambda: whole.unsqueeze(0),
        }
        choice = "3-D parts" if pair else draw(st.sampled_from(["3-D", "5-D"]))
    else:  # "parts disagree": a pair whose parts differ in batch, q_len or heads
        made = {
            "pe one head": lambda: (nope, pe[:, :, :1]),
            "pe one token": lambda: (nope, pe[:, :1]),
            "pe one request": lambda: (nope, pe[:1]),
        }
        choice = draw(st.sampled_from(list(made)))
    case.query = made[choice]()
    return choice


def bend_query_kind(draw, case, how):
    if not query_tensors(case):
        return NOTHING
    nope, pe, whole = parts_of(case.query)
    case.query = {
        "string": lambda: "query",
        "None": lambda: None,
        "triple": lambda: (nope, pe, whole),
        "single": lambda: (whole,),
        "nested list": lambda: [[1.0] * 4, [2.0] * 4],
        "pe on other device": lambda: (nope, pe.to(case.other)),
    }[how]()
    return how


def bend_kv_shape(draw, case, how):
    if not kv_tensors(case):
        return NOTHING
    ckv, kpe, whole = parts_of(case.kv_cache)
    pair = isinstance(case.kv_cache, (tuple, list))
    view = pages_view(whole)
    if how == "last dim":
        made = {
            "kpe dim 32": lambda: (ckv, kpe[..., :32]),
            "ckv dim 576": lambda: (torch.cat([pages_view(ckv), pages_view(ckv)[..., :ROPE]], dim=-1), kpe),
            "whole dim 512": lambda: view[..., :512].contiguous(),
            "whole dim 640": lambda: torch.cat([view, view[..., :64]], dim=-1),
        }
        choice = draw(st.sampled_from(list(made)[:2] if pair else list(made)[2:]))
    elif how == "rank":
        made = {
            "2-D ckv": lambda: (pages_view(ckv).flatten(0, 1), kpe),
            "2-D": lambda: view.flatten(0, 1),
            "5-D": lambda: view.unsqueeze(1).unsqueeze(1),
        }
        choice = "2-D ckv" if pair else draw(st.sampled_from(["2-D", "5-D"]))
    elif how == "4-D with 2 in dim 1":
        made = {
            "ckv 4-D with 2 in dim 1": lambda: (pages_view(ckv).unsqueeze(1).expand(-1, 2, -1, -1), kpe),
            "4-D with 2 in dim 1": lambda: view.unsqueeze(1).expand(-1, 2, -1, -1),
        }
        choice = list(made)[0 if pair else 1]
    else:  # "parts disagree": a pair whose parts differ in pages or page size
        made = {
            "kpe one page fewer": lambda: (ckv, pages_view(kpe)[1:]),
            "kpe half the page size": lambda: (ckv, pages_view(kpe)[:, ::2]),
        }
        choice = draw(st.sampled_from(list(made)))
    case.kv_cache = made[choice]()
    return choice


def bend_kv_kind(draw, case, how):
    if not kv_tensors(case):
        return NOTHING
    kv = case.kv_cache
    ckv, kpe, whole = parts_of(kv)
    case.kv_cache = {
        "string": lambda: "kv_cache",
        "None": lambda: None,
        "triple": lambda: (ckv, kpe, whole),
        "on other device": lambda: kv.to(case.other) if whole is kv else (ckv.to(case.other), kpe.to(case.other)),
        "kpe on other device": lambda: (ckv, kpe.to(case.other)),
    }[how]()
    return how


def bend_block_tables(draw, case, how):
    bt = case.block_tables
    if not isinstance(bt, torch.Tensor) or bt.dim() != 2 or bt.is_meta:  # a meta tensor has no values to bend
        return NOTHING
    case.block_tables = {
        "int64": lambda: bt.long(),
        "int16": lambda: bt.clamp(-(1 << 15), (1 << 15) - 1).to(torch.int16),
        "float32": lambda: bt.float(),
        "one row more": lambda: torch.cat([bt, bt[:1] if bt.shape[0] else bt.new_zeros(1, bt.shape[1])]),
        "one row fewer": lambda: bt[1:],
        "1-D": lambda: bt.reshape(-1),
        "3-D": lambda: bt.unsqueeze(0),
        "list": lambda: bt.tolist(),
        "on other device": lambda: bt.to(case.other),
    }[how]()
    return how


def bend_page_id(draw, case, how):
    """A page id that a request reads, negative or past the cache's pages."""
    bt, sl = case.block_tables, case.seq_lens
    if not (kv_tensors(case) and isinstance(bt, torch.Tensor) and isinstance(sl, torch.Tensor) and bt.dim() == 2):
        return NOTHING
    if bt.is_meta or sl.is_meta:  # moved to the meta device by an earlier bend: no values to read
        return NOTHING
    pages = pages_view(parts_of(case.kv_cache)[2]).shape
    lengths = sl.reshape(-1).tolist()[: bt.shape[0]]
    reads = [(b, i) for b, n in enumerate(lengths) for i in range(min(-(-int(n) // pages[1]), bt.shape[1]))]
    if not reads:
        return "no request reads a page: nothing to bend"
    b, i = draw(st.sampled_from(reads))
    values = [-1, -(1 << 31)] if how == "negative" else [pages[0], pages[0] + 1, 1 << 30]
    value = draw(st.sampled_from(values))
    case.block_tables = bt.clone()
    case.block_tables[b, i] = value
    return f"block_tables[{b}, {i}] = {value}"


def bend_seq_lens(draw, case, how):
    sl = case.seq_lens
    if not isinstance(sl, torch.Tensor) or sl.dim() != 1 or sl.is_meta:  # a meta tensor has no values to bend
        return NOTHING
    case.seq_lens = {
        "int64": lambda: sl.long(),
        "float32": lambda: sl.float(),
        "one more": lambda: torch.cat([sl, sl.new_zeros(1)]),
        "one fewer": lambda: sl[1:],
        "2-D": lambda: sl.unsqueeze(0),
        "list": lambda: sl.tolist(),
        "on other device": lambda: sl.to(case.other),
    }[how]()
    return how


def bend_seq_len_value(draw, case, how):
    """One request's length negative, past max_seq_len, or past what the table covers (max_seq_len
    raised with it). Lengths stay below 2**20: were a check missing, the reference's scratch stays small."""
    sl, msl, bt = case.seq_lens, case.max_seq_len, case.block_tables
    if not (isinstance(sl, torch.Tensor) and sl.dim() == 1 and is_int(msl) and kv_tensors(case)):
        return NOTHING
    if sl.numel() == 0:
        return "no request: nothing to bend"
    page = pages_view(parts_of(case.kv_cache)[2]).shape[1]
    capacity = bt.shape[1] * page if isinstance(bt, torch.Tensor) and bt.dim() == 2 else msl
    b = draw(st.integers(0, sl.numel() - 1))
    if how == "negative":
        value = draw(st.sampled_from([-1, -(1 << 31)]))
    elif how == "past max_seq_len":
        value = draw(st.sampled_from([msl + 1, max(capacity, msl + 1), 1 << 20]))
    else:  # "past the table", with max_seq_len raised to it
        value = msl = draw(st.sampled_from([capacity + 1, capacity + page, 1 << 20]))
    case.seq_lens, case.max_seq_len = sl.clone(), msl
    case.seq_lens[b] = value
    return f"seq_lens[{b}] = {value}, max_seq_len {msl}"


def bend_max_seq_len(draw, case, how):
    msl = case.max_seq_len if is_int(case.max_seq_len) else 64
    page = pages_view(parts_of(case.kv_cache)[2]).shape[1] if kv_tensors(case) else 16
    bt = case.block_tables
    capacity = bt.shape[1] * page if isinstance(bt, torch.Tensor) and bt.dim() == 2 else msl
    case.max_seq_len = {
        "negative": lambda: -1,
        "past the table": lambda: capacity + 1,
        "float": lambda: float(msl),
        "bool": lambda: True,
        "None": lambda: None,
        "string": lambda: str(msl),
        "tensor": lambda: torch.tensor(msl),
        "one less": lambda: max(msl - 1, 0),  # served unless a request is that long
        "zero": lambda: 0,
    }[how]()
    return repr(case.max_seq_len)


def bend_scale(draw, case, how):
    name = draw(st.sampled_from(["bmm1", "bmm2"]))
    made = {
        "fp64 tensor": lambda: torch.tensor([0.05], dtype=torch.float64, device=case.device),
        "fp16 tensor": lambda: torch.tensor([0.05], dtype=torch.float16, device=case.device),
        "int tensor": lambda: torch.tensor([1], dtype=torch.int32, device=case.device),
        "two elements": lambda: torch.tensor([0.05, 0.05], device=case.device),
        "no element": lambda: torch.zeros(0, device=case.device),
        "bool": lambda: True,
        "string": lambda: "0.05",
        "None": lambda: None,
        "on other device": lambda: torch.tensor([0.05], device=case.other),
        "0-d fp32 tensor": lambda: torch.tensor(0.05, device=case.device),  # served
    }[how]()
    setattr(case, name, made)
    return f"{name}_scale: {how}"


def bend_out(draw, case, how):
    rows = rows_of(case)
    if rows is None:
        return NOTHING
    batch, q_len, heads = rows
    full = (*rows, LATENT)
    case.out = {
        "fp32": lambda: poisoned(full, torch.float32, case.device),
        "fp16": lambda: poisoned(full, torch.float16, case.device),
        "one head more": lambda: poisoned((batch, q_len, heads + 1, LATENT), torch.bfloat16, case.device),
        "3-D": lambda: poisoned((batch, heads, LATENT), torch.bfloat16, case.device),  # served for q_len 1
        "flat": lambda: poisoned((batch * q_len * heads * LATENT,), torch.bfloat16, case.device),
        "transposed": lambda: poisoned((batch, heads, q_len, LATENT), torch.bfloat16, case.device).transpose(1, 2),
        "on other device": lambda: poisoned(full, torch.bfloat16, case.other),
        "list": lambda: [0.0] * 4,
        "2-D rows": lambda: poisoned((batch * q_len * heads, LATENT), torch.bfloat16, case.device),
    }[how]()
    return how


def bend_lse(draw, case, how):
    rows = rows_of(case)
    if rows is None:
        return NOTHING
    batch, q_len, heads = rows
    case.lse = {
        "fp64": lambda: poisoned(rows, torch.float64, case.device),
        "bf16": lambda: poisoned(rows, torch.bfloat16, case.device),
        "one head more": lambda: poisoned((batch, q_len, heads + 1), torch.float32, case.device),
        "[B, q_len * H]": lambda: poisoned((batch, q_len * heads), torch.float32, case.device),
        "on other device": lambda: poisoned(rows, torch.float32, case.other),
        "list": lambda: [0.0],
        "transposed [B * q_len, H]": lambda: poisoned((heads, batch * q_len), torch.float32, case.device).t(),  # served
    }[how]()
    return how


def bend_workspace(draw, case, how):
    case.workspace = {
        "strided": lambda: torch.zeros(1 << 12, dtype=torch.uint8, device=case.device)[::2],
        "on other device": lambda: torch.zeros(1 << 12, dtype=torch.uint8, device=case.other),
        "bytes object": lambda: bytes(16),
        "int8": lambda: torch.zeros(1 << 12, dtype=torch.int8, device=case.device),  # served: any dtype
    }[how]()
    return how


def bend_dims(draw, case, how):
    wrong = {
        "qk_nope_head_dim": [64, 256, 512, 576, "128", None, 192],
        "kv_lora_rank": [256, 576, 0],
        "qk_rope_head_dim": [32, 128, 0],
    }[how]
    value = draw(st.sampled_from(wrong))
    setattr(case, how, value)
    unused = case.entry == "mla_decode" and how != "qk_nope_head_dim"
    return f"{how}={value!r}" + (" (mla_decode takes no such argument)" if unused else "")


def bend_device(draw, case, how):
    """Every tensor of the call on the other device (GPU run: the CPU, served by the reference; CPU
    run: the meta device, which nothing serves)."""
    move = lambda x: x.to(case.other) if isinstance(x, torch.Tensor) else x  # noqa: E731
    for name in ("query", "kv_cache"):
        value = getattr(case, name)
        setattr(case, name, tuple(map(move, value)) if isinstance(value, (tuple, list)) else move(value))
    for name in ("block_tables", "seq_lens", "workspace", "out", "lse", "bmm1", "bmm2"):
        setattr(case, name, move(getattr(case, name)))
    case.device, case.other = case.other, case.device
    return f"all on {case.device}"


def bend_split_keywords(draw, case, how):
    """batch_mla_paged_attention with one keyword of a split pair left out."""
    if case.entry != "batch_mla" or not case.split_keywords:
        return "not a split-keyword call: nothing to bend"
    names = []
    if isinstance(case.query, (tuple, list)) and len(case.query) == 2:
        names += ["q_nope", "q_pe"]
    if isinstance(case.kv_cache, (tuple, list)) and len(case.kv_cache) == 2:
        names += ["ckv_cache", "kpe_cache"]
    if not names:
        return "no pair passed by keyword: nothing to bend"
    case.dropped = (draw(st.sampled_from(names)),)
    return f"{case.dropped[0]} left out"


# name: (bend, its variants)
BENDS = {
    "query dtype": (bend_query_dtype, ("fp16", "fp32", "fp8 e5m2", "int8", "bf16", "fp8 e4m3")),
    "kv_cache dtype": (bend_kv_dtype, ("fp16", "fp32", "fp8 e5m2", "int8", "bf16", "fp8 e4m3")),
    "both dtypes": (bend_both_dtypes, ("fp16", "fp32", "fp8 e5m2", "bf16", "fp8 e4m3")),
    "query shape": (bend_query_shape, ("last dim", "rank", "parts disagree")),
    "query kind": (bend_query_kind, ("string", "None", "triple", "single", "nested list", "pe on other device")),
    "kv_cache shape": (bend_kv_shape, ("last dim", "rank", "4-D with 2 in dim 1", "parts disagree")),
    "kv_cache kind": (bend_kv_kind, ("string", "None", "triple", "on other device", "kpe on other device")),
    "block_tables": (
        bend_block_tables,
        ("int64", "int16", "float32", "one row more", "one row fewer", "1-D", "3-D", "list", "on other device"),
    ),
    "page id": (bend_page_id, ("negative", "past the cache")),
    "seq_lens": (bend_seq_lens, ("int64", "float32", "one more", "one fewer", "2-D", "list", "on other device")),
    "seq_len value": (bend_seq_len_value, ("negative", "past max_seq_len", "past the table")),
    "max_seq_len": (
        bend_max_seq_len,
        ("negative", "past the table", "float", "bool", "None", "string", "tensor", "one less", "zero"),
    ),
    "scale": (
        bend_scale,
        (
            "fp64 tensor",
            "fp16 tensor",
            "int tensor",
            "two elements",
            "no element",
            "bool",
            "string",
            "None",
            "on other device",
            "0-d fp32 tensor",
        ),
    ),  # fmt: skip
    "out": (
        bend_out,
        ("fp32", "fp16", "one head more", "3-D", "flat", "transposed", "on other device", "list", "2-D rows"),
    ),
    "lse": (
        bend_lse,
        ("fp64", "bf16", "one head more", "[B, q_len * H]", "on other device", "list", "transposed [B * q_len, H]"),
    ),
    "workspace": (bend_workspace, ("strided", "on other device", "bytes object", "int8")),
    "dims": (bend_dims, ("qk_nope_head_dim", "kv_lora_rank", "qk_rope_head_dim")),
    "split keywords": (bend_split_keywords, ("one left out",)),
    "device": (bend_device, ("everything on the other device",)),
}

# Faults of the drawn call itself (name: variant: the value drawn instead of a served one)
LAYOUT_FAULTS = ("start", "strides", "last dim")  # see layouts()
SIZE_FAULTS = {
    "heads": {"0": 0, "129": 129},
    "q_len": {"0": 0, f"{MAX_Q_LEN + 1}": MAX_Q_LEN + 1},
    "page size": {"3": 3, "24": 24, "2048": 2048},
    "block_tables layout": {"transposed": "transposed", "every other column": "every other column"},
    "seq_lens layout": {"every other element": True},
}
# Every (fault, variant) of a "one fault" call: an unsupported size or layout, or a bend.
BEND_FAULTS = [(name, variant) for name, (_, variants) in BENDS.items() for variant in variants]
FAULTS = (
    [(name, variant) for name, variants in SIZE_FAULTS.items() for variant in variants]
    + [(f"{part} layout", fault) for part in ("query", "kv_cache") for fault in LAYOUT_FAULTS]
    + BEND_FAULTS
)
