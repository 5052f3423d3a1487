"""scripts/probe_mla_chunk_attention.py on the CPU: it records the layouts of the MLA block's
attention inputs at a chunk (the memory-efficient check and the peak memory are GPU-only)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.source_files import import_file

ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_records_the_chunk_attention_inputs(tmp_path) -> None:
    script = import_file(ROOT / "scripts" / "probe_mla_chunk_attention.py")
    out = tmp_path / "probe.json"
    assert script.main(["--length", "40", "--tokens", "8", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    cfg = script.TINY
    heads, qk = cfg.heads, cfg.qk_nope_dim + cfg.rope_dim
    assert (got["device"], got["length"], got["tokens"]) == ("cpu", 40, 8)
    assert got["q"]["shape"] == [1, heads, 8, qk] and got["k"]["shape"] == [1, heads, 40, qk]
    assert got["v"]["shape"] == [1, heads, 40, cfg.v_head_dim]
    assert [got[n]["stride"][-1] for n in "qkv"] == [1, 1, 1]
