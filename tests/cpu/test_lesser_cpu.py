"""The CPU a user has: the numerics, the kernel paths, the precision choice and the real pair in
every mode, run again with this CPU held to AVX2 (no AVX-512, no bfloat16 instructions), as most
laptops, desktops and many cloud VMs are. oneDNN's ``ONEDNN_MAX_CPU_ISA`` and ATen's
``ATEN_CPU_CAPABILITY`` hold both libraries there on a larger x86 CPU. On a CPU with nothing above
AVX2 they change nothing, so there the suite's own run of those files is the held run and is not
repeated."""
import json
import os
import platform
import subprocess
import sys

import pytest

from dsd.backends.machine import CpuCapability, cpu_flags

HELD = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
# the files whose checks broke on an AVX2-only CPU, the numerics every mode rests on, and the main
# job's real pair in every mode with dtype "auto" (its greedy tokens against the target's)
UNDER_AVX2 = ["tests/dsd/test_kernels.py", "tests/dsd/test_precision.py", "tests/dsd/test_feature_draft.py",
              "tests/dsd/test_verification.py", "tests/services/test_real_pair_every_mode.py"]
# the instruction sets above AVX2 that oneDNN or ATen use; a CPU with none of them already runs
# exactly what the hold allows
ABOVE_AVX2 = ("avx512", "avx10", "avx_vnni", "avx_ne_convert", "amx")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or "avx2" not in cpu_flags(),
                                reason="the AVX2 hold is an x86 switch and needs a CPU with AVX2")


def held_env(tmp_path) -> dict[str, str]:
    # a cache of its own: a choice kept for the whole CPU must not be read under the hold
    return {**os.environ, **HELD, "DSD_CACHE_DIR": str(tmp_path / "cache")}


def test_the_switches_hold_pytorch_and_onednn_to_avx2(tmp_path):
    probe = "import json; from dsd.backends.machine import CpuCapability; print(json.dumps(CpuCapability.of_this_machine().to_dict()))"
    held = json.loads(subprocess.run([sys.executable, "-c", probe], env=held_env(tmp_path), cwd=ROOT, check=True,
                                     capture_output=True, text=True, timeout=120).stdout)
    assert held["aten"] == "AVX2" and held["onednn_bf16"] is False, held
    assert held["isa_switches"] == HELD
    assert CpuCapability.of_this_machine().model == held["model"], "the hold changes what runs, not the CPU"


def held_already(flags: set[str]) -> bool:
    return not any(flag.startswith(ABOVE_AVX2) for flag in flags)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.skipif(held_already(cpu_flags()), reason="this CPU has nothing above AVX2, so the hold changes "
                    "nothing: the suite's own run of these files is the held run")
def test_the_numerics_kernels_precision_and_real_pair_pass_with_the_cpu_held_to_avx2(tmp_path):
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *UNDER_AVX2]
    done = subprocess.run(command, env=held_env(tmp_path), cwd=ROOT, capture_output=True, text=True, timeout=1800)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    assert done.returncode == 0, f"under {HELD}:\n{tail}"
    assert " passed" in done.stdout.splitlines()[-1] and "skipped" not in done.stdout.splitlines()[-1], tail


def test_only_a_cpu_with_nothing_above_avx2_counts_as_held_already():
    assert held_already({"sse4_2", "avx", "avx2", "fma", "f16c"})
    for above in ("avx512f", "avx512_bf16", "avx_vnni", "avx_ne_convert", "amx_tile", "avx10_1"):
        assert not held_already({"avx", "avx2", above}), above
