"""dtype = "auto" for the hf backend: bfloat16 where it is fast, float32 elsewhere."""
import pytest

from dsd.backends.hf import HfBackendConfig, fast_dtype


def test_auto_dtype_is_bfloat16_on_a_cpu_with_amx_and_float32_without(tmp_path):
    amx = tmp_path / "amx"
    amx.write_text("flags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    plain = tmp_path / "plain"
    plain.write_text("flags\t\t: fpu avx2 fma\n")
    assert fast_dtype("cpu", str(amx)) == "bfloat16"
    assert fast_dtype("cpu", str(plain)) == "float32"
    assert fast_dtype("cpu", str(tmp_path / "missing")) == "float32"
    assert fast_dtype("cuda:0", str(plain)) == "bfloat16"


def test_auto_is_resolved_in_the_config_so_every_service_loads_the_same_dtype():
    assert HfBackendConfig(dtype="auto").dtype in ("bfloat16", "float32")
    with pytest.raises(ValueError, match="dtype"):
        HfBackendConfig(dtype="int4")
