"""The main job's real pair with ``dtype = "auto"``, as ``./scripts/main.sh`` starts it, over
loopback in every mode for a few tokens: the precision choice, the kernel paths and each mode's
exchange must run on whatever CPU this is (tests/cpu/ runs this file again with the CPU held to
AVX2, where a bfloat16 kernel path once crashed the choice before the first point)."""

import pytest

from dsd.backends.hf import HfBackendConfig
from dsd.backends.machine import CpuCapability
from dsd.drive.generation import generate_ar
from dsd.modes import names, speculative_modes
from dsd.speculation.stopping import StopRule
from pairs import smollm2
from tests.services.real_pair_checks import run, start_pair

pytestmark = [pytest.mark.model, pytest.mark.slow]

PAIR = smollm2.REPO / "models" / "smollm2-chat"
TOKENS = 12


@pytest.fixture(scope="module")
def auto_pair(spawn, tmp_path_factory):
    return start_pair(spawn, tmp_path_factory, PAIR, n_prompts=2, dtype="auto")


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_auto_times_only_what_this_cpu_runs_and_records_the_cpu(auto_pair):
    choice = HfBackendConfig(pair_path=str(PAIR), dtype="auto").precision_choice()
    cpu = CpuCapability.of_this_machine()
    timed = {t.dtype for t in choice.times}
    assert "float32" in timed and choice.target_dtype in timed and choice.draft_dtype in timed
    assert timed | set(choice.dropped) == {"float32", "bfloat16"}
    assert choice.cpu["model"] == cpu.model and choice.cpu["aten"] == cpu.aten
    if not cpu.onednn_bf16:
        for t in choice.times:
            assert "onednn_packed" not in t.kernels or t.dtype == "float32", t


def test_every_mode_runs_on_this_cpu_and_greedy_follows_the_target(auto_pair):
    verifier, edge, target, prompts = auto_pair
    stop = StopRule(max_new_tokens=TOKENS, eos_token_id=target.eos_token_id)
    expected = [generate_ar(target, p, stop, seq_id=f"ref-{i}").tokens for i, p in enumerate(prompts)]
    for mode in names():
        rows, rounds = run(edge, verifier, f"every-{mode}", mode, prompts, TOKENS)
        got = [
            [int(t) for t in row["token_ids"].split()] for row in sorted(rows, key=lambda r: int(r["request_index"]))
        ]
        assert [len(g) for g in got] == [len(e) for e in expected], mode
        if mode == "ar":
            assert got == expected, "cloud AR runs the target's own one-position passes"
        else:
            # a verification pass rounds unlike a one-position pass (the precision's shape error,
            # test_real_pair.py), so greedy speculation may leave the target's path late, not early
            agreed = sum(common_prefix(g, e) for g, e in zip(got, expected))
            assert agreed >= 0.5 * sum(map(len, expected)), (mode, got, expected)
        if mode in speculative_modes():
            assert any(int(r["accepted"]) > 0 for r in rounds), f"{mode}: the draft must be right sometimes"
