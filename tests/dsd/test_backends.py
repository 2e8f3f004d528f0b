import json

import pytest

from dsd.backends.factory import (
    BACKEND_CONFIGS,
    DTYPE_NAMES,
    HfBackendConfig,
    SyntheticBackendConfig,
    backend_from_dict,
    backend_from_json,
    load_pair,
)
from dsd.backends.torch_lm import DTYPES
from dsd.sequence import common_prefix_length


def test_factory_dtype_names_are_the_torch_backends():
    assert sorted(DTYPE_NAMES) == sorted(DTYPES)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"kind": "onnx"}, "backend kind"),
        ({"kind": ["hf"]}, "backend kind"),
        ({"kind": "hf", "dtype": "int8"}, "dtype"),
        ({"kind": "hf", "target_path": "/x"}, "target_path and draft_path"),
        ({"alpha": -0.1}, "alpha"),
        ({"kind": "hf", "alpha": 0.5}, r"unknown key.*'alpha'.*'hf'"),  # a real pair has no alpha
        ({"alhpa": 0.5}, r"unknown key.*alhpa"),
        ({"alpha": "0.8"}, r"backend\.alpha.*'0\.8'"),  # JSON types are checked
        ({"seed": True}, r"backend\.seed"),
        ({"vocab_size": 1.5}, r"backend\.vocab_size"),
    ],
)
def test_backend_config_errors_name_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        backend_from_dict(values)


@pytest.mark.parametrize(
    "config",
    [
        SyntheticBackendConfig(),
        SyntheticBackendConfig(alpha=0.6, seed=3, eos_prob=0.1, acceptance="stratified"),
        SyntheticBackendConfig(acceptance_rounds="4:2,4:4"),
        HfBackendConfig(),
        HfBackendConfig(target_path="/m/t", draft_path="/m/d", dtype="bfloat16"),
    ],
)
def test_every_shipped_kind_makes_a_json_round_trip(config):
    text = config.to_json()
    assert json.loads(text)["kind"] == config.kind and BACKEND_CONFIGS[config.kind] is type(config)
    assert backend_from_json(text) == config


def test_an_empty_backend_json_is_the_synthetic_default_and_bad_json_is_named():
    assert backend_from_json("") == SyntheticBackendConfig() == backend_from_dict({})
    with pytest.raises(ValueError, match="--backend-json"):
        backend_from_json("{kind: hf}")
    with pytest.raises(ValueError, match="--backend-json must be a JSON object"):
        backend_from_json("[1]")


def test_a_portable_config_carries_the_trace_inline(tmp_path):
    path = tmp_path / "rounds.csv"
    path.write_text(
        "point,client_id,request_index,round_index,proposed,accepted,stale,error\n"
        "p,0,0,0,4,2,False,\np,0,0,1,4,4,False,\n"
    )
    config = SyntheticBackendConfig(acceptance_trace=str(path))
    sent = config.portable()
    assert sent.acceptance_trace == "" and sent.trace().rounds == config.trace().rounds == ((4, 2), (4, 4))
    assert str(tmp_path) not in sent.to_json()
    assert HfBackendConfig().portable() == HfBackendConfig()


def test_missing_pair_says_how_to_build_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="build-pair"):
        load_pair(HfBackendConfig(pair_path=str(tmp_path / "nothing")))
    with pytest.raises(ValueError, match="backend.pair_path"):
        HfBackendConfig(pair_path=str(tmp_path / "nothing")).check_files()


@pytest.mark.parametrize(
    "a,b,n",
    [
        ([], [1], 0),
        ([1, 2, 3], [1, 2, 3, 4], 3),
        ([1, 2, 3], [1, 9, 3], 1),
        ([5], [6], 0),
        ([1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 0], 6),
    ],
)
def test_common_prefix_length(a, b, n):
    assert common_prefix_length(a, b) == n == common_prefix_length(b, a)
