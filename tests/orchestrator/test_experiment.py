import pytest

from orchestrator.experiment import experiment_from_dict, load_experiment

BASE = {"name": "t", "profile": "toy-edge-cloud", "backend": {"kind": "synthetic"}}


def test_shipped_experiment_files_are_valid():
    for name in ("crossover", "crossover-synthetic"):
        experiment = load_experiment(f"experiments/{name}.toml")
        assert experiment.name == name


@pytest.mark.parametrize("change,message", [
    ({"rtt_msec": [1]}, "unknown key.*rtt_msec"),
    ({"backend": {"kind": "synthetic", "alhpa": 0.5}}, r"unknown key.*\[backend\].*alhpa"),
    ({"gamma": [0]}, "'gamma'"),
    ({"gamma": [2.5]}, "'gamma'"),
    ({"rtt_ms": [-5]}, "'rtt_ms'"),
    ({"modes": ["sync", "async"]}, "'modes'"),
    ({"requests": 0}, "'requests'"),
    ({"launcher": "k8s"}, "'launcher'"),
    ({"backend": {"kind": "synthetic", "alpha": 1.5}}, "alpha"),
    ({"backend": {"kind": "onnx"}}, "backend kind"),
    ({"profile": ""}, "'profile'"),
])
def test_bad_experiments_fail_before_anything_starts_naming_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        experiment_from_dict({**BASE, **change})


def test_missing_name_and_bad_toml_are_named(tmp_path):
    with pytest.raises(ValueError, match="missing key 'name'"):
        experiment_from_dict({"backend": {"kind": "synthetic"}, "profile": "toy-edge-cloud"})
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_experiment(bad)


def test_scalars_become_one_element_grids():
    experiment = experiment_from_dict({**BASE, "gamma": 4, "rtt_ms": 10})
    assert experiment.gamma == (4,) and experiment.rtt_ms == (10,)
