"""The compose launcher's config, without Docker: bad values are refused naming the field, and
every variable it sets is one that compose.yaml reads."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from dsd.backends.factory import HfBackendConfig, SyntheticBackendConfig
from dsd.costs.profiles import get_profile
from orchestrator.launchers.compose import (
    ADOPT_SETTINGS,
    COMPOSE_DEFAULTS,
    COMPOSE_FILE,
    ComposeConfig,
    adopt_mismatches,
    fix_command,
)
from orchestrator.launchers.services_config import ServicesConfig

TOY = get_profile("toy-edge-cloud")


@pytest.mark.parametrize(
    "field, value",
    [
        ("n_edges", 0),
        ("n_edges", 251),
        ("n_edges", True),
        ("threads", 0),
        ("max_batch", 0),
        ("batch_window_ms", -1.0),
        ("max_sessions", 0),
        ("up_timeout_s", 0),
        ("verify_count", -1),
        ("project", "Bad Name"),
        ("build", "sometimes"),
        ("subnet", "10.0.0.0/30"),
        ("subnet", "nonsense"),
        ("shaper_backend", "tc"),
        ("adopt", "yes"),
        ("adopt", 1),
        ("compose_file", "/nonexistent.yaml"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(field, value):
    with pytest.raises(ValueError, match=field):
        ComposeConfig(**{"n_edges": 2, "profile": TOY, field: value})


def test_the_synthetic_backend_needs_a_profile():
    with pytest.raises(ValueError, match="profile"):
        ComposeConfig(n_edges=2)


def test_an_hf_pair_must_lie_under_models(tmp_path):
    with pytest.raises(ValueError, match="pair_path"):
        ComposeConfig(n_edges=1, backend=HfBackendConfig(pair_path=str(tmp_path)))


def test_every_variable_the_launcher_sets_is_read_by_compose_yaml():
    text = COMPOSE_FILE.read_text()
    env = ComposeConfig(n_edges=3, profile=TOY, max_batch=4).compose_env()
    unread = [key for key in env if not re.search(r"\$\{" + key + r"[:}-]", text)]
    assert unread == []
    assert json.loads(env["DSD_PROFILE_JSON"])["t_draft_edge_s"] == TOY.t_draft_edge_s
    assert env["DSD_PROFILE"] == "" and env["DSD_MAX_BATCH"] == "4"


def test_the_sweeps_services_config_maps_onto_a_compose_config():
    services = ServicesConfig(
        SyntheticBackendConfig(alpha=0.6), TOY, n_edges=3, max_batch=2, batch_window_ms=1.5, work_dir="/tmp/sweep-work"
    )
    config = ComposeConfig.from_services(services)
    assert (
        config.n_edges,
        config.backend.alpha,
        config.profile,
        config.max_batch,
        config.batch_window_ms,
        config.log_dir,
    ) == (3, 0.6, TOY, 2, 1.5, "/tmp/sweep-work")
    with pytest.raises(ValueError, match="extra_verifier_args"):
        ComposeConfig.from_services(
            ServicesConfig(SyntheticBackendConfig(), TOY, extra_verifier_args=("--max-gamma", "8"))
        )


def test_the_defaults_the_adopt_check_assumes_are_compose_yamls():
    text = COMPOSE_FILE.read_text()
    found = {}
    for name, default in re.findall(r"\$\{(DSD_[A-Z_]+):?-([^}]*)\}", text):
        assert found.setdefault(name, default) == default, f"{name} has two defaults in compose.yaml"
    assert {k: found.get(k) for k in COMPOSE_DEFAULTS} == COMPOSE_DEFAULTS
    flags = set(re.findall(r"- --([a-z-]+)=", text))
    assert {flag for _, flag, _, _ in ADOPT_SETTINGS} | {"backend-json", "profile", "profile-json"} <= flags


class Service:
    """What the adopt check reads of a container: its name and compose.yaml's command line."""

    def __init__(self, name: str, **flags) -> None:
        defaults = {
            "backend-json": "",
            "profile": "toy-edge-cloud",
            "profile-json": "",
            "threads": "1",
            "max-batch": "1",
            "batch-window-ms": "0",
            "max-sessions": "256",
        }
        defaults.update({k.replace("_", "-"): v for k, v in flags.items()})
        self.name = name
        self.attrs = {"Config": {"Cmd": ["python3", "-m", "services.x", *(f"--{k}={v}" for k, v in defaults.items())]}}


def test_a_project_started_with_compose_yamls_defaults_matches_the_same_settings_given_as_json():
    config = ComposeConfig(n_edges=2, profile=TOY)  # the launcher passes the profile as JSON
    assert adopt_mismatches(config, Service("v"), [Service("e1"), Service("e2")]) == []
    assert fix_command(config, 4) == "docker compose up -d --scale edge=4 --wait"


def test_every_difference_is_named_with_both_values_and_the_fix_sets_it():
    config = ComposeConfig(
        n_edges=2, profile=get_profile("cpu2-default-pair"), backend=SyntheticBackendConfig(alpha=0.6), max_batch=4
    )
    found = adopt_mismatches(
        config,
        Service("v", backend_json='{"kind": "synthetic", "alpha": 0.6, "seed": 2}'),
        [Service("e1"), Service("e2", backend_json='{"alpha": 0.7}')],
    )
    texts = [text for _, text in found]
    assert texts == [
        "backend.seed: running 2 (v), the experiment's 0",
        "max_batch: running '1' (v), the experiment's '4'",
        "profile: running 'toy-edge-cloud' (v), the experiment's 'cpu2-default-pair'",
    ]
    assert [text for _, text in adopt_mismatches(config, Service("v"), [])][
        0
    ] == "backend.alpha: running 0.8 (v), the experiment's 0.6"
    fix = fix_command(config, 4, also=[v for variables, _ in found for v in variables])
    assert fix == (
        "DSD_BACKEND_JSON="
        + shlex.quote(config.backend.to_json())
        + " DSD_MAX_BATCH=4 DSD_PROFILE=cpu2-default-pair docker compose up -d --scale edge=4 --wait"
    )


def test_a_value_found_wrong_is_set_in_the_fix_even_when_it_is_compose_yamls_default():
    config = ComposeConfig(n_edges=1, profile=TOY, project="other")
    found = adopt_mismatches(config, Service("v", profile="cpu2-default-pair"), [Service("e1")])
    assert [text for _, text in found] == [
        "profile: running 'cpu2-default-pair' (v), the experiment's 'toy-edge-cloud'"
    ]
    assert (
        fix_command(config, 1, also=found[0][0])
        == "DSD_PROFILE=toy-edge-cloud docker compose -p other up -d --scale edge=1 --wait"
    )


def test_the_containers_get_the_backend_whole_with_the_pair_where_they_mount_it():
    from orchestrator.launchers.compose import MODELS_DIR
    from dsd.backends.factory import backend_from_json

    config = ComposeConfig(
        n_edges=1, backend=HfBackendConfig(pair_path=str(MODELS_DIR / "default-pair"), dtype="bfloat16")
    )
    sent = backend_from_json(config.compose_env()["DSD_BACKEND_JSON"])
    assert sent == HfBackendConfig(pair_path="/app/models/default-pair", dtype="bfloat16")
    running = Service("v", backend_json=sent.to_json())
    assert adopt_mismatches(config, running, []) == []
    assert [text for _, text in adopt_mismatches(config, Service("v"), [])] == [
        "backend.kind: running 'synthetic' (v), the experiment's 'hf'"
    ]
    assert fix_command(config, 1).startswith("DSD_BACKEND_JSON=" + shlex.quote(sent.to_json()) + " docker compose")


def test_the_admission_limit_reaches_the_verifier_and_a_project_running_another_is_not_adopted():
    config = ComposeConfig.from_services(ServicesConfig(SyntheticBackendConfig(), TOY, n_edges=1), max_sessions=3)
    assert config.compose_env()["DSD_MAX_SESSIONS"] == "3"
    assert re.search(r"- --max-sessions=\$\{DSD_MAX_SESSIONS:-256\}", COMPOSE_FILE.read_text())
    found = adopt_mismatches(config, Service("v"), [Service("e1", max_sessions="3")])
    assert [text for _, text in found] == ["max_sessions: running '256' (v), the experiment's '3'"]
    assert fix_command(config, 1, also=found[0][0]) == "DSD_MAX_SESSIONS=3 docker compose up -d --scale edge=1 --wait"
