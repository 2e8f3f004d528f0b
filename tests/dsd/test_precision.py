"""dtype = "auto" (dsd.backends.precision): the precision is chosen from times measured on this
machine, the CPU flags only recorded as a first guess; every service of a machine resolves alike."""

from __future__ import annotations

import json

import pytest

from dsd.backends import hf, precision
from dsd.backends.factory import backend_from_json
from dsd.backends.hf import HfBackendConfig
from dsd.backends.machine import CpuCapability, cpu_flags, cpu_model, machine_key
from dsd.backends.precision import PrecisionChoice, PrecisionTimes, choose, first_guess


def times(dtype: str, ar_ms: float, verify_ms: float, draft_ms: float) -> PrecisionTimes:
    return PrecisionTimes(dtype, ar_ms / 1e3, {3: verify_ms / 1e3, 5: verify_ms / 1e3}, draft_ms / 1e3)


def test_the_precision_with_the_faster_verification_wins():
    table = [times("float32", 60, 125, 14), times("bfloat16", 52, 59, 11)]
    assert choose(table) == ("bfloat16", "bfloat16")


def test_a_tie_keeps_float32():
    table = [times("float32", 60, 70, 14), times("bfloat16", 60, 69, 14)]
    assert choose(table) == ("float32", "float32")


def test_a_faster_verification_that_slows_the_decode_step_is_refused():
    # emulated bfloat16: a few-position pass looks cheap next to a slow one-position step
    table = [times("float32", 60, 80, 14), times("bfloat16", 90, 75, 20)]
    assert choose(table)[0] == "float32"


def test_the_draft_takes_its_own_fastest_precision():
    table = [times("float32", 60, 125, 9), times("bfloat16", 52, 59, 12)]
    assert choose(table) == ("bfloat16", "float32")


def test_the_table_needs_the_float32_reference():
    with pytest.raises(ValueError, match="float32"):
        choose([times("bfloat16", 52, 59, 11)])


def test_the_flag_rule_is_only_a_first_guess(tmp_path):
    amx, bf16, plain = tmp_path / "amx", tmp_path / "bf16", tmp_path / "plain"
    amx.write_text("flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    bf16.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    plain.write_text("flags\t\t: fpu avx2 fma\n")
    assert first_guess("cpu", str(amx)) == first_guess("cpu", str(bf16)) == "bfloat16"
    assert first_guess("cpu", str(plain)) == first_guess("cpu", str(tmp_path / "missing")) == "float32"
    assert first_guess("cuda:0", str(plain)) == "bfloat16"


@pytest.fixture
def fake_measurement(monkeypatch, tmp_path):
    """A measurement that records its calls and answers a fixed table (bfloat16 faster)."""
    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def measure(target_path, draft_path, *args, **kwargs):
        calls.append((target_path, draft_path))
        return [times("float32", 60, 125, 14), times("bfloat16", 52, 59, 11)]

    monkeypatch.setattr(precision, "measure", measure)
    return calls


@pytest.mark.model
def test_auto_resolves_once_per_machine_and_every_service_gets_the_same(fake_measurement):
    config = HfBackendConfig(dtype="auto")
    assert (config.dtype, config.draft_dtype) == ("bfloat16", "bfloat16")
    again = HfBackendConfig(dtype="auto")
    assert again.dtype == config.dtype and len(fake_measurement) == 1, "the second resolution reads the cache"
    service_side = backend_from_json(config.to_json())  # what a launcher hands a service
    assert (service_side.dtype, service_side.draft_dtype) == ("bfloat16", "bfloat16")
    assert len(fake_measurement) == 1
    record = config.precision_choice().to_dict()
    assert record["target_dtype"] == "bfloat16" and {c["dtype"] for c in record["candidates"]} == {
        "float32",
        "bfloat16",
    }
    assert PrecisionChoice.from_dict(json.loads(json.dumps(record))) == config.precision_choice()


@pytest.mark.model
def test_a_forced_dtype_is_kept_and_the_draft_may_still_be_auto(fake_measurement):
    config = HfBackendConfig(dtype="float32", draft_dtype="auto")
    assert (config.dtype, config.draft_dtype) == ("float32", "bfloat16")
    assert HfBackendConfig(dtype="float32").draft_dtype == "float32"
    assert HfBackendConfig(dtype="float32", draft_dtype="").draft_dtype == "float32"


def test_bad_precision_settings_name_their_field():
    with pytest.raises(ValueError, match="dtype"):
        HfBackendConfig(dtype="int4")
    with pytest.raises(ValueError, match="draft_dtype"):
        HfBackendConfig(draft_dtype="int4")
    with pytest.raises(ValueError, match="kernels"):
        HfBackendConfig(kernels="fast")


def test_auto_without_a_built_pair_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="holds no model"):
        HfBackendConfig(pair_path=str(tmp_path), dtype="auto")
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "eagle_config.json").write_text("{}")  # a feature draft, but no target
    with pytest.raises(ValueError, match="target holds no model"):
        HfBackendConfig(pair_path=str(tmp_path), dtype="auto")


@pytest.mark.model
@pytest.mark.slow
def test_auto_measures_the_real_candidates_on_this_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path))
    choice = HfBackendConfig(dtype="auto").precision_choice()
    assert {t.dtype for t in choice.times} == {"float32", "bfloat16"}
    for t in choice.times:
        assert t.t_ar_s > 0 and set(t.t_verify_s) == {3, 5} and t.t_draft_s > 0
    assert choice.target_dtype in ("float32", "bfloat16") and choice.machine


def test_a_forced_dtype_this_cpu_cannot_run_is_refused_before_anything_loads(monkeypatch):
    monkeypatch.setattr(
        precision,
        "_probe_fails",
        lambda dtype: (
            "" if dtype == "float32" else "mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw"
        ),
    )
    hf._check_forced.cache_clear()
    with pytest.raises(ValueError, match=r"backend\.draft_dtype = 'bfloat16': this CPU cannot run it \(.*ATen"):
        HfBackendConfig(dtype="float32", draft_dtype="bfloat16")
    hf._check_forced.cache_clear()


def test_a_forced_dtype_that_runs_only_emulated_says_so(capsys):
    slow = CpuCapability("test CPU", "x86_64", "AVX2", True, True, onednn_bf16=False, onednn_fp16=False)
    lines: list[str] = []
    precision.check_runs("backend.dtype", "bfloat16", slow, log=lines.append)
    assert lines and "runs emulated on test CPU (x86_64, ATen AVX2; no native bfloat16, float16)" in lines[0]
    lines.clear()
    precision.check_runs("backend.dtype", "float32", slow, log=lines.append)
    assert lines == []


@pytest.mark.model
@pytest.mark.slow
def test_a_candidate_that_fails_on_this_cpu_is_left_out_with_its_reason(monkeypatch, tmp_path):
    """The crash of a bfloat16 path on an AVX2-only CPU, as the choice now meets it: bfloat16's
    load fails, float32 is timed alone and chosen, and the record says why."""
    from dsd.backends import torch_lm

    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path))
    real_load = torch_lm.TorchLM.load.__func__

    def load(cls, config):
        if config.dtype == "bfloat16":
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw")
        return real_load(cls, config)

    monkeypatch.setattr(torch_lm.TorchLM, "load", classmethod(load))
    lines: list[str] = []
    target, draft = HfBackendConfig().model_paths()
    choice = precision.resolve(target, draft, log=lines.append)
    assert (choice.target_dtype, choice.draft_dtype) == ("float32", "float32")
    assert [t.dtype for t in choice.times] == ["float32"]
    assert "avx512bw" in choice.dropped["bfloat16"] and any("bfloat16 left out" in line for line in lines)
    assert choice.cpu["model"] and choice.cpu["aten"]


def test_the_cpu_is_read_from_an_aarch64_cpuinfo(tmp_path):
    arm = tmp_path / "cpuinfo"
    arm.write_text(
        "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 "
        "atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve "
        "asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\n"
        "CPU revision\t: 1\n\nprocessor\t: 1\nFeatures\t: fp asimd\nCPU part\t: 0xd40\n"
    )
    assert "bf16" in cpu_flags(str(arm)) and "sve" in cpu_flags(str(arm))
    assert cpu_model(str(arm)).startswith("Neoverse-V1")
    assert first_guess("cpu", str(arm)) == "bfloat16"
    assert machine_key(str(arm)).startswith("Neoverse-V1")
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel\t\t: 17\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n")
    assert cpu_model(str(x86)) == "AMD EPYC 7B13" and cpu_flags(str(x86)) == {"fpu", "avx2", "fma"}


def test_this_machines_capability_names_the_cpu_not_the_kernel():
    cpu = CpuCapability.of_this_machine()
    assert cpu.model == cpu_model() and "Linux" not in cpu.describe()
    assert cpu.aten in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE128", "SVE256", "SVE512", "NEON")
    assert cpu.native("float32") and set(cpu.to_dict()) >= {"model", "aten", "onednn_bf16", "isa_switches"}
