"""benchmarks/kernel_regime.py and benchmarks/spec_cache.py run end to end and print the figures
their issues ask for (smallest configurations; the real pair where the figure needs it)."""

from __future__ import annotations

import pytest

from pairs import smollm2
from tests.benchmarks.test_benchmark_smoke import REPO, _run

SMOLLM2 = REPO / "models" / "smollm2-chat"


@pytest.fixture
def real_pair_target():
    """The real pair's target, written from the GGUF once (as scripts/main.sh does); skipped
    only where it cannot be made."""
    try:
        smollm2.materialize_target(SMOLLM2)
    except FileNotFoundError as exc:
        pytest.skip(f"the real pair's target cannot be made here: {exc}")


@pytest.mark.model
def test_kernel_regime_prints_both_precisions_ratios_and_its_choice(tmp_path):
    figures = _run(
        ["benchmarks/kernel_regime.py", "--pair", str(REPO / "models" / "default-pair"), "--rounds", "2"], tmp_path
    )
    for key in (
        "cpu_flags_bf16",
        "chosen_dtype",
        "t_ar_ms",
        "verify3_over_ar",
        "verify5_over_ar",
        "fp32_verify3_over_ar",
        "fp32_verify5_over_ar",
        "bf16_verify3_over_ar",
        "draft_step_over_ar",
    ):
        assert key in figures, key
    assert figures["chosen_dtype"] in ("float32", "bfloat16")
    assert figures["cpu_flags_bf16"] in ("amx_bf16", "avx512_bf16", "none")
    assert figures["t_ar_ms"] > 0 and figures["fp32_verify3_over_ar"] > 0


@pytest.mark.model
@pytest.mark.slow
def test_spec_cache_prints_the_batch_curve_and_the_hit_rates_on_the_real_pair(real_pair_target, tmp_path):
    figures = _run(["benchmarks/spec_cache.py", "--prompts", "1", "--passes", "1"], tmp_path)
    assert figures["batch1_over_step"] == 1.0 and figures["batch8_over_step"] > 0
    assert 0.0 <= figures["hit_rate"] <= 1.0 and 0.0 <= figures["baseline_hit_rate"] <= 1.0
    assert figures["rounds"] > 0 and "hit_rate_predicted" in figures
