"""scripts/ncu_sass_summary.py on a per-instruction CSV recorded on the H200 (session 14,
call 2: the resident cross-entropy at decode 64 x 128256; stored gzipped, as
scripts/profile_candidate_gpu.sh now writes them), and on files it must refuse."""

import gzip
from pathlib import Path

import pytest

from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]
summary = import_file(ROOT / "scripts" / "ncu_sass_summary.py")
RECORDED = (
    ROOT
    / "docs/benchmarks/2026-11-30-h200/session14/call2-1c134f2/profile"
    / "ncu-cross_entropy-decode-64x128256-sass.csv.gz"
)


def test_the_recorded_profile_sums_by_reason_and_ranks_the_instructions() -> None:
    rows = summary.read_rows(RECORDED)
    report = summary.summarize(rows, top=3).splitlines()
    assert report[0] == f"712 warp samples over {len(rows)} instructions"
    assert report[1].split()[:2] == ["stall_barrier", "283"]  # the largest reason first
    top = report[report.index("top 3 instructions by samples:") + 1]
    assert top.split()[:2] == ["179", "UCGABAR_WAIT"]  # the cluster barrier's wait


def test_the_csv_as_text_reads_as_the_gzipped_one(tmp_path) -> None:
    plain = tmp_path / "profile-sass.csv"
    plain.write_bytes(gzip.decompress(RECORDED.read_bytes()))
    assert summary.read_rows(plain) == summary.read_rows(RECORDED)


def test_a_file_without_the_table_or_without_rows_is_refused(tmp_path) -> None:
    no_table = tmp_path / "log.csv"
    no_table.write_text("==PROF== Disconnected from process 1\n")
    with pytest.raises(ValueError, match="no per-instruction table"):
        summary.read_rows(no_table)
    header_only = tmp_path / "empty.csv"
    header_only.write_text('"Address","Source","Warp Stall Sampling (All Samples)"\n')
    with pytest.raises(ValueError, match="no instruction"):
        summary.read_rows(header_only)
    assert summary.main([str(header_only)]) == 2
