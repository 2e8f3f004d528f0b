import pytest

from orchestrator.spec.experiment import experiment_from_dict, load_experiment
from orchestrator.spec.file_paths import REPO

PAIR = REPO / "models" / "default-pair"

BASE = {"name": "t", "profile": "toy-edge-cloud", "backend": {"kind": "synthetic"}}


def test_shipped_experiment_files_are_valid():
    for name in ("crossover", "crossover-synthetic", "gain-window", "capacity"):
        experiment = load_experiment(f"experiments/{name}.toml")
        assert experiment.name == name


@pytest.mark.parametrize(
    "change,message",
    [
        ({"rtt_msec": [1]}, "unknown key.*rtt_msec"),
        ({"backend": {"kind": "synthetic", "alhpa": 0.5}}, r"unknown key.*\[backend\].*alhpa"),
        ({"gamma": [0]}, "'gamma'"),
        ({"gamma": [2.5]}, "'gamma'"),
        ({"rtt_ms": [-5]}, "'rtt_ms'"),
        ({"modes": ["sync", "async"]}, "'modes'"),
        ({"requests": 0}, "'requests'"),
        ({"launcher": "k8s"}, "'launcher'"),
        ({"transport": "udp"}, "'transport'.*one of ws, tcp.*'udp'"),
        ({"backend": {"kind": "synthetic", "alpha": 1.5}}, "alpha"),
        ({"backend": {"kind": "onnx"}}, "backend kind"),
        ({"profile": ""}, "'profile'"),
        ({"profile": "no-such-profile"}, "'profile'.*no-such-profile"),
        ({"profile": ["toy-edge-cloud", "no-such-profile"]}, "'profile'.*no-such-profile"),
        ({"profile": ["toy-edge-cloud", "toy-edge-cloud"]}, "'profile'.*distinct"),
        ({"alpha": [0.5, 0.0]}, r"'alpha'.*\(0, 1\]"),
        ({"alpha": [1.01]}, r"'alpha'.*\(0, 1\]"),
        ({"alpha": [0.5, 0.5]}, "'alpha'.*repeated"),
        ({"alpha": [0.5], "backend": {"kind": "hf"}}, "'alpha'.*only with the synthetic backend"),
        (
            {"profile": ["toy-edge-cloud", "cpu2-default-pair"], "backend": {"kind": "hf"}},
            "'profile'.*only with the synthetic backend",
        ),
        ({"alpha": [0.5], "backend": {"kind": "synthetic", "alpha": 0.5}}, "alpha is given twice"),
    ],
)
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


def test_swept_alpha_and_profile_become_one_experiment_per_group():
    experiment = experiment_from_dict({**BASE, "alpha": [0.6, 0.9], "profile": ["toy-edge-cloud", "cpu2-default-pair"]})
    assert experiment.alphas() == (0.6, 0.9)
    assert experiment.profiles() == ("toy-edge-cloud", "cpu2-default-pair")
    group = experiment.for_group("cpu2-default-pair", 0.9)
    assert group.profile == "cpu2-default-pair" and group.backend.alpha == 0.9 and group.alpha == ()
    plain = experiment_from_dict(BASE)
    assert plain.alphas() == (plain.backend.alpha,) and plain.profiles() == ("toy-edge-cloud",)


@pytest.mark.parametrize(
    "sampling,message",
    [
        ({"temprature": 0.8}, r"unknown key.*\[sampling\].*temprature"),
        ({"temperature": -0.1}, "'sampling.temperature'"),
        ({"temperature": [0.5, 0.5]}, "'sampling.temperature'.*distinct"),
        ({"top_p": 0.0}, "'sampling.top_p'"),
        ({"top_p": [0.9, 1.5]}, "'sampling.top_p'"),
        ({"top_k": -1}, "'sampling.top_k'"),
        ({"top_k": 2.5}, "'sampling.top_k'"),
        ({"seed": "x"}, "'sampling.seed'"),
    ],
)
def test_bad_sampling_tables_are_refused_naming_the_key(sampling, message):
    with pytest.raises(ValueError, match=message):
        experiment_from_dict({**BASE, "sampling": sampling})


def test_sampling_values_and_lists_become_one_setting_per_combination():
    experiment = experiment_from_dict({**BASE, "seed": 5, "sampling": {"temperature": [0, 0.8], "top_p": [0.9, 1]}})
    settings = experiment.sampling_settings()
    # seed: the experiment's unless [sampling] says; greedy ignores truncation: one setting
    assert [(s.temperature, s.top_k, s.top_p, s.sampling_seed) for s in settings] == [
        (0.0, 0, 1.0, 5),
        (0.8, 0, 0.9, 5),
        (0.8, 0, 1.0, 5),
    ]
    assert settings[1].run_fields() == {"temperature": 0.8, "top_k": None, "top_p": 0.9, "seed": 5}
    assert settings[0].tag == "" and settings[1].tag == "T0.8p0.9s5"


def test_relative_paths_are_taken_from_the_experiment_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "prompts.txt").write_text("one prompt\nanother prompt\n")
    (folder / "data" / "link.csv").write_text("t_s,rtt_ms\n0,20\n1,40\n")
    (folder / "e.toml").write_text(
        f'name = "paths"\n[backend]\nkind = "hf"\npair_path = "{PAIR}"\n'
        '[workload]\nsource = "lines"\npath = "data/prompts.txt"\n'
        '[link]\ntrace_csv = "data/link.csv"\n'
    )
    monkeypatch.chdir(tmp_path)  # not the file's folder
    experiment = load_experiment(folder / "e.toml")
    assert experiment.workload.path == str(folder / "data" / "prompts.txt")
    assert experiment.link.trace_csv == str(folder / "data" / "link.csv")
    assert [step.at_s for step in experiment.link.schedule.steps] == [0, 1]


def test_a_path_found_only_from_the_working_directory_is_used_with_a_warning(tmp_path, monkeypatch):
    (tmp_path / "prompts.txt").write_text("one prompt\n")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "e.toml").write_text(
        'name = "paths"\n[backend]\nkind = "hf"\n'
        'pair_path = "models/default-pair"\n'  # the repository's
        '[workload]\nsource = "lines"\npath = "prompts.txt"\n'
    )
    monkeypatch.chdir(tmp_path)
    with pytest.warns(FutureWarning, match="experiment file's folder") as warned:
        experiment = load_experiment(tmp_path / "exp" / "e.toml")
    assert sorted(str(w.message).split("'")[1] for w in warned) == ["backend.pair_path", "workload.path"]
    assert experiment.workload.path == str(tmp_path / "prompts.txt")
    assert experiment.backend.pair_path == str(PAIR)


def test_the_regime_map_files_are_valid_and_reach_past_the_predicted_crossover():
    from dsd.analytic import queueing
    from dsd.costs.profiles import load_profiles

    for name in ("regime-map-sim-serial", "regime-map-sim-batched", "regime-map-netns", "regime-map-real"):
        experiment = load_experiment(f"experiments/{name}.toml")
        assert experiment.name == name and min(experiment.clients) == 1 and min(experiment.rtt_ms) == 0
    for name in ("regime-map-sim-serial", "regime-map-sim-batched", "regime-map-netns"):
        experiment = load_experiment(f"experiments/{name}.toml")
        times = load_profiles()[experiment.profile].times
        crossover_ms = 1e3 * queueing.crossover_rtt_s(
            "pipelined_vs_colocated",
            max(experiment.clients),
            experiment.backend.alpha,
            experiment.gamma[0],
            times,
            experiment.max_batch,
        )
        assert 0 < crossover_ms < max(experiment.rtt_ms)
    assert max(load_experiment("experiments/regime-map-netns.toml").clients) >= 16


@pytest.mark.parametrize("launcher", ["netns", "loopback", "compose", "auto"])
def test_a_grid_with_more_clients_than_the_verifier_admits_is_refused_naming_the_setting(launcher):
    from orchestrator.spec.experiment import MAX_NETWORK_CLIENTS

    experiment_from_dict({**BASE, "launcher": launcher, "clients": [1, MAX_NETWORK_CLIENTS]})
    with pytest.raises(
        ValueError,
        match=rf"'clients'.*1\.\.{MAX_NETWORK_CLIENTS} on the {launcher} launcher"
        r".*max_sessions",
    ):
        experiment_from_dict({**BASE, "launcher": launcher, "clients": [1, MAX_NETWORK_CLIENTS + 1]})


def test_the_network_ceiling_is_the_verifiers_admission_limit():
    from orchestrator.launchers.compose_config import ComposeConfig
    from orchestrator.spec.experiment import MAX_NETWORK_CLIENTS
    from services.verifier.limits import VerifierLimits

    assert VerifierLimits().max_sessions == MAX_NETWORK_CLIENTS
    assert ComposeConfig.__dataclass_fields__["max_sessions"].default == MAX_NETWORK_CLIENTS
