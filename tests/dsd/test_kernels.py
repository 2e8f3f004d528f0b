"""Kernel paths (dsd.backends.kernels): every path computes the layer's product, a model with
measured paths gives the logits of PyTorch's default path, and a path is chosen only when it is
faster by the margin."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from dsd.backends.kernels import (
    ATEN,
    BUCKETS,
    MKL_PACKED,
    ONEDNN_PACKED,
    PATHS,
    KernelConfig,
    PathLinear,
    _fastest,
    available_paths,
    bucket_of,
    choose_paths,
    install_paths,
)
from dsd.backends.machine import CpuCapability
from dsd.backends.torch_lm import TorchLM

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def tiny_llama(dtype: torch.dtype, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_available_path_computes_the_layers_product(dtype):
    linear = torch.nn.Linear(64, 48, bias=True).to(dtype)
    paths = available_paths(dtype)
    layer = PathLinear(linear, paths)
    assert set(layer.forms) == set(paths) - {ATEN}, layer.dropped
    if dtype == torch.float32 and CpuCapability.of_this_machine().arch == "x86_64":
        assert layer.forms, "an x86 CPU build of PyTorch has a packed float32 path"
    for rows in (1, 3, 5, 17):
        x = torch.randn(1, rows, 64, dtype=dtype)
        expected = F.linear(x.float(), linear.weight.float(), linear.bias.float())
        for path in (ATEN, *layer.forms):
            got = layer.run(path, x).float()
            assert got.shape == expected.shape
            assert torch.allclose(got, expected, atol=TOLERANCE[dtype] * 10, rtol=TOLERANCE[dtype]), path


def test_packed_paths_exist_only_where_the_precision_has_them():
    assert MKL_PACKED not in available_paths(torch.bfloat16)
    assert available_paths(torch.float16, PATHS) == (ATEN,)
    assert available_paths(torch.float32, (ATEN,)) == (ATEN,)


def cpu(**changes) -> CpuCapability:
    """An x86 CPU with AVX-512 and native bfloat16 (a Xeon with AMX, a Zen 4), changed as given."""
    base = CpuCapability(
        "test CPU", "x86_64", "AVX512", has_mkl=True, has_onednn=True, onednn_bf16=True, onednn_fp16=False
    )
    return dataclasses.replace(base, **changes)


def test_paths_are_offered_only_where_this_cpu_runs_them():
    avx2 = cpu(aten="AVX2", onednn_bf16=False)  # a Zen 3 or a laptop: no AVX512-BF16
    assert available_paths(torch.float32, PATHS, avx2) == (ATEN, MKL_PACKED, ONEDNN_PACKED)
    assert available_paths(torch.bfloat16, PATHS, avx2) == (ATEN,), "oneDNN refuses bfloat16 without AVX512-BF16"
    assert available_paths(torch.bfloat16, PATHS, cpu()) == (ATEN, ONEDNN_PACKED)
    # an ARM build (Graviton, Apple silicon under Docker): no MKL; oneDNN over Arm's library
    arm = cpu(arch="aarch64", aten="SVE256", has_mkl=False, onednn_bf16=True)
    assert available_paths(torch.float32, PATHS, arm) == (ATEN, ONEDNN_PACKED)
    assert available_paths(
        torch.bfloat16, PATHS, cpu(arch="aarch64", aten="DEFAULT", has_mkl=False, has_onednn=False)
    ) == (ATEN,)


def test_a_path_this_cpu_refuses_is_dropped_with_a_line_not_a_crash(monkeypatch, capsys):
    def refused(*args):
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx512bw")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refused)
    model = tiny_llama(torch.float32)
    layers = install_paths(model, KernelConfig((ATEN, ONEDNN_PACKED)))
    assert all(ONEDNN_PACKED not in layer.forms for layer in layers)
    assert "onednn_packed dropped for float32" in capsys.readouterr().err
    choose_paths(layers, KernelConfig(repeats=1), "float32")
    prompt = [(3 * i + 1) % 101 for i in range(20)]
    assert TorchLM(model, "m", None).logits("s", prompt, 3).shape == (3, 101)


def test_a_path_whose_first_pass_fails_is_dropped_and_the_pass_rerun_on_aten(capsys):
    linear = torch.nn.Linear(64, 32)
    layer = PathLinear(linear, (ATEN, MKL_PACKED) if torch._C.has_mkl else (ATEN,))
    layer.forms["broken"] = torch.zeros(1)  # a form whose pass raises, as a refused kernel does
    real_run = layer.run

    def run(path, x):
        if path == "broken":
            raise RuntimeError("this CPU lacks the instructions")
        return real_run(path, x)

    layer.run = run
    timed = choose_paths([layer], KernelConfig(repeats=1), "float32")
    assert "broken" not in layer.forms and "broken" in layer.dropped
    assert all("broken" not in t for t in timed.times_ms["32x64"].values())
    assert "its first pass failed" in capsys.readouterr().err
    layer.forms["broken"] = torch.zeros(1)
    layer.choice = {b: "broken" for b in BUCKETS}  # a kept choice that fails at its first pass
    x = torch.randn(1, 3, 64)
    assert torch.allclose(layer(x), F.linear(x, linear.weight, linear.bias), atol=1e-5)
    assert set(layer.choice.values()) == {ATEN} and "a pass failed" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_on_measured_paths_gives_the_default_paths_logits(dtype):
    reference = TorchLM(tiny_llama(dtype), "ref", None)
    model = tiny_llama(dtype)
    layers = install_paths(model, KernelConfig())
    assert len(layers) == 2 * 7 + 1, "every projection of both layers and the head"
    choice = choose_paths(layers, KernelConfig(repeats=1), str(dtype))
    # force every non-default path at least once, whatever the timing chose
    for layer in layers:
        layer.choice = {b: ([ATEN, *layer.forms])[i % (1 + len(layer.forms))] for i, b in enumerate(BUCKETS)}
    fast = TorchLM(model, "fast", None)
    prompt = [(7 * i + 3) % 101 for i in range(40)]
    for n in (1, 3, 5, 9, 20):  # 20: beyond the buckets, a prefill-sized pass
        tokens = prompt + list(range(n))
        a = reference.logits("s", tokens, n)
        b = fast.logits("s", tokens, n)
        assert torch.allclose(a, b, atol=TOLERANCE[dtype] * 20, rtol=TOLERANCE[dtype]), n
    assert set(choice.choice) == {"64x64", "32x64", "128x64", "64x128", "101x64"}
    assert model.lm_head.weight is model.model.embed_tokens.weight, "tied weights stay tied"


def test_a_path_is_chosen_only_when_it_beats_aten_by_the_margin():
    assert _fastest({ATEN: 10.0, MKL_PACKED: 9.8}, 0.03) == ATEN
    assert _fastest({ATEN: 10.0, MKL_PACKED: 9.0, ONEDNN_PACKED: 9.5}, 0.03) == MKL_PACKED
    assert _fastest({ATEN: 10.0, ONEDNN_PACKED: 12.0}, 0.0) == ATEN


def test_rows_fall_in_the_smallest_bucket_that_holds_them():
    assert [bucket_of(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 3, 4, 8, 8, 16, 16]
    assert bucket_of(17) is None


def test_unused_forms_are_freed_after_the_choice():
    layer = PathLinear(torch.nn.Linear(64, 64), available_paths(torch.float32))
    layer.keep({b: ATEN for b in BUCKETS})
    assert layer.forms == {}


def test_a_kernel_config_names_its_bad_field():
    with pytest.raises(ValueError, match="paths"):
        KernelConfig(("mkl_packed",))
    with pytest.raises(ValueError, match="repeats"):
        KernelConfig(repeats=0)


def test_a_kept_choice_is_taken_by_the_next_load_without_timing(tmp_path, monkeypatch):
    from dsd.backends import kernels
    from dsd.backends.torch_lm import TorchLMConfig

    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "llama"
    tiny_llama(torch.float32).save_pretrained(folder)
    first = TorchLM.load(TorchLMConfig(str(folder), "float32"))
    assert first.kernel_choice is not None

    def no_timing(*args, **kwargs):
        raise AssertionError("a kept choice must not be timed again")

    monkeypatch.setattr(kernels, "choose_paths", no_timing)
    second = TorchLM.load(TorchLMConfig(str(folder), "float32"))
    assert second.kernel_choice.choice == first.kernel_choice.choice
    prompt = [(5 * i + 1) % 101 for i in range(30)]
    assert torch.allclose(first.logits("a", prompt, 3), second.logits("b", prompt, 3), atol=1e-4)
    with pytest.raises(AssertionError, match="timed again"):
        TorchLM.load(TorchLMConfig(str(folder), "float32", kernel_store=False))  # afresh: timed
