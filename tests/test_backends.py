import pytest

from dsd.backends.factory import DTYPE_NAMES, BackendConfig, load_pair
from dsd.backends.torch_lm import DTYPES
from dsd.sequence import common_prefix_length


def test_factory_dtype_names_are_the_torch_backends():
    assert sorted(DTYPE_NAMES) == sorted(DTYPES)


@pytest.mark.parametrize("kwargs,message", [
    ({"kind": "onnx"}, "backend kind"),
    ({"dtype": "int8"}, "dtype"),
    ({"target_path": "/x"}, "target_path and draft_path"),
    ({"alpha": -0.1}, "alpha"),
])
def test_backend_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BackendConfig(**kwargs)


def test_missing_pair_says_how_to_build_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="build-pair"):
        load_pair(BackendConfig(kind="hf", pair_path=str(tmp_path / "nothing")))


@pytest.mark.parametrize("a,b,n", [([], [1], 0), ([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], [1, 9, 3], 1),
                                   ([5], [6], 0), ([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 0], 6)])
def test_common_prefix_length(a, b, n):
    assert common_prefix_length(a, b) == n == common_prefix_length(b, a)
