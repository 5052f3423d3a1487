"""`autotune bench --preflight`: the pre-flight runs before measuring on a GPU and its findings
travel with the result; on the CPU there is nothing to check."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from appliance.cli import main


def test_an_unknown_preflight_policy_is_a_usage_error() -> None:
    result = CliRunner().invoke(
        main, ["bench", "rmsnorm", "torch_rmsnorm.py", "--preflight", "sometimes"]
    )
    assert result.exit_code == 2
    assert "--preflight" in result.output


@pytest.mark.gpu
def test_bench_on_the_gpu_records_the_preflight() -> None:
    result = CliRunner().invoke(
        main,
        [
            "bench", "rmsnorm", "triton_rmsnorm.py", "--shape", "decode-1x4096",
            "--peer", "eager", "--device", "cuda", "--preflight", "warn", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    data = json.loads(result.output[result.output.index("{") :])
    assert data["preflight"]["policy"] == "warn"
    assert isinstance(data["preflight"]["findings"], list)
