"""Kernel paths (dsd.backends.kernels): every path computes the layer's product, a model with
measured paths gives the logits of PyTorch's default path, and a path is chosen only when it is
faster by the margin."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from dsd.backends.kernels import (ATEN, BUCKETS, MKL_PACKED, ONEDNN_PACKED, PATHS, KernelConfig, PathLinear,
                                  _fastest, available_paths, bucket_of, choose_paths, install_paths)
from dsd.backends.torch_lm import TorchLM

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def tiny_llama(dtype: torch.dtype, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_available_path_computes_the_layers_product(dtype):
    linear = torch.nn.Linear(64, 48, bias=True).to(dtype)
    layer = PathLinear(linear, available_paths(dtype))
    assert layer.forms, "a CPU build of PyTorch has at least one packed path"
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
    for n in (1, 3, 5, 9, 20):           # 20: beyond the buckets, a prefill-sized pass
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
        TorchLM.load(TorchLMConfig(str(folder), "float32", kernel_store=False))    # afresh: timed
