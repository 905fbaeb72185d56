"""Constants shared by the kernels and Python are written once, in csrc/constants.h."""

import re
import shutil

import pytest

from mla_backend import config, kernel_constants, launcher, shapes
from mla_backend.kernel_build import SOURCES, headers, source_stamp
from mla_backend.kernel_constants import HEADER, TileShape, csrc_dir, read_constants, read_tile_shapes


def test_python_takes_its_constants_from_the_kernel_header():
    constants = read_constants(csrc_dir() / HEADER)
    assert constants == {
        "LATENT_DIM": shapes.KV_LORA_RANK,
        "ROPE_DIM": shapes.ROPE_DIM,
        "MAX_ROWS": 1024,
        "MAX_KV_SPLITS": kernel_constants.MAX_KV_SPLITS,
        "TOKENS_PER_TILE": kernel_constants.TOKENS_PER_TILE,
        "MAX_PAGE_SIZE": kernel_constants.MAX_PAGE_SIZE,
        "MIN_TILES_PER_SPLIT": kernel_constants.MIN_TILES_PER_SPLIT,
        "MAX_PLAN_PIECES": kernel_constants.MAX_PLAN_PIECES,
        "PLAN_CUT_WAVES": kernel_constants.PLAN_CUT_WAVES,
        "SPLITS_PER_MERGE_TILE": kernel_constants.SPLITS_PER_MERGE_TILE,
        "FIXED_TILES_PER_CTA": kernel_constants.FIXED_TILES_PER_CTA,
        "FEW_SPLITS_MAX": kernel_constants.FEW_SPLITS_MAX,
        "PLAN_MIN_BATCH": kernel_constants.PLAN_MIN_BATCH,
        "STEP_PLAN_MIN_BATCH": kernel_constants.STEP_PLAN_MIN_BATCH,
        "DS_MLA_SCALE_OFFSET": 512,  # fp8_ds_mla rows: 512 e4m3 bytes, 4 fp32 scales, 64 bf16 rope values
        "DS_MLA_ROPE_OFFSET": 528,
        "DS_MLA_ROW_BYTES": 656,
    }
    assert (constants["FEW_SPLITS_MAX"], constants["PLAN_MIN_BATCH"], constants["STEP_PLAN_MIN_BATCH"]) == (8, 32, 4)
    assert config.MLABackendConfig.model_fields["num_kv_splits"].metadata[1].le == constants["MAX_KV_SPLITS"]
    assert shapes.MAX_HEADS * shapes.MAX_Q_LEN <= constants["MAX_ROWS"]


def test_the_tile_table_is_read_in_order_and_chooses_the_first_entry_that_covers_the_rows():
    table = read_tile_shapes(csrc_dir() / HEADER)
    assert table == (TileShape(True, 16, 1, 1), TileShape(True, 1024, 1, 2), TileShape(False, 16, 1, 1),
                     TileShape(False, 1024, 2, 1))  # fmt: skip
    for fp8 in (True, False):
        for rows in (1, 16, 17, 128, 1024):
            chosen = launcher.tile_shape(rows, fp8)
            first = next(s for s in table if s.fp8 == fp8 and rows <= s.max_rows)
            assert chosen == (first.row_groups, first.fragments)
        with pytest.raises(ValueError, match="no kernel tile covers 1025 rows"):
            launcher.tile_shape(1025, fp8)


def test_a_changed_table_changes_the_choice(tmp_path):
    header = tmp_path / HEADER
    text = (csrc_dir() / HEADER).read_text().replace("X(1, 16, 1, 1)", "X(1, 32, 1, 1)")
    header.write_text(text)
    assert read_tile_shapes(header)[0] == TileShape(True, 32, 1, 1)


def test_the_kernels_use_the_header():
    sources = {name: (csrc_dir() / name).read_text() for name in headers(csrc_dir()) + SOURCES}
    uses = {name for name, text in sources.items() if name != HEADER for _ in re.finditer(r"\bMLA_\w+", text)}
    assert "constexpr int kMaxSplits = MLA_MAX_KV_SPLITS;" in sources["common/kernel_constants.h"]
    assert "constexpr int kBlockN = MLA_TOKENS_PER_TILE;" in sources["common/kernel_constants.h"]
    assert "MLA_TILE_SHAPES(MLA_DISPATCH_TILE_SHAPE)" in sources["api/dispatch.cuh"]  # the kernels built
    assert "MLA_TILE_SHAPES(MLA_TILE_ROWS)" in sources["schedule/host_schedule.h"]  # the rows a CTA takes
    assert {"common/kernel_constants.h", "api/dispatch.cuh", "schedule/host_schedule.h"} <= uses


def test_every_source_is_part_of_the_source_stamp(tmp_path):
    """Every header in csrc/ and its folders, and the translation unit: an edit to any changes the stamp."""
    for name in headers(csrc_dir()) + SOURCES:
        copy = tmp_path / name.replace("/", "_").replace(".", "_")
        shutil.copytree(csrc_dir(), copy)
        (copy / name).write_text((copy / name).read_text() + "\n// edited\n")
        assert source_stamp(copy, "sm_90a") != source_stamp(csrc_dir(), "sm_90a"), name
    assert HEADER in headers(csrc_dir())
    assert {"common/params.h", "decode/mainloop.cuh", "merge/merge_kernel.cuh", "schedule/plan_layout.h"} <= set(
        headers(csrc_dir())
    )
