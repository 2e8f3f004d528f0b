"""The compose launcher's config, without Docker: bad values are refused naming the field, and
every variable it sets is one that compose.yaml reads."""
from __future__ import annotations

import json
import re

import pytest

from dsd.backends.factory import BackendConfig
from dsd.profiles import get_profile
from orchestrator.launchers.compose import COMPOSE_FILE, ComposeConfig
from orchestrator.launchers.loopback import ServicesConfig

TOY = get_profile("toy-edge-cloud")


@pytest.mark.parametrize("field, value", [
    ("n_edges", 0), ("n_edges", 251), ("n_edges", True), ("threads", 0), ("max_batch", 0),
    ("batch_window_ms", -1.0), ("up_timeout_s", 0), ("verify_count", -1), ("project", "Bad Name"),
    ("build", "sometimes"), ("subnet", "10.0.0.0/30"), ("subnet", "nonsense"), ("shaper_backend", "tc"), ("adopt", "yes"), ("compose_file", "/nonexistent.yaml"),
])
def test_a_bad_value_is_refused_naming_its_field(field, value):
    with pytest.raises(ValueError, match=field):
        ComposeConfig(**{"n_edges": 2, "profile": TOY, field: value})


def test_the_synthetic_backend_needs_a_profile():
    with pytest.raises(ValueError, match="profile"):
        ComposeConfig(n_edges=2)


def test_an_hf_pair_must_lie_under_models(tmp_path):
    with pytest.raises(ValueError, match="pair_path"):
        ComposeConfig(n_edges=1, backend=BackendConfig(kind="hf", pair_path=str(tmp_path)))


def test_every_variable_the_launcher_sets_is_read_by_compose_yaml():
    text = COMPOSE_FILE.read_text()
    env = ComposeConfig(n_edges=3, profile=TOY, max_batch=4).compose_env()
    unread = [key for key in env if not re.search(r"\$\{" + key + r"[:}-]", text)]
    assert unread == []
    assert json.loads(env["DSD_PROFILE_JSON"])["t_draft_edge_s"] == TOY.t_draft_edge_s
    assert env["DSD_PROFILE"] == "" and env["DSD_MAX_BATCH"] == "4"


def test_the_sweeps_services_config_maps_onto_a_compose_config():
    services = ServicesConfig(BackendConfig(alpha=0.6), TOY, n_edges=3, max_batch=2, batch_window_ms=1.5,
                              work_dir="/tmp/sweep-work")
    config = ComposeConfig.from_services(services)
    assert (config.n_edges, config.backend.alpha, config.profile, config.max_batch, config.batch_window_ms,
            config.log_dir) == (3, 0.6, TOY, 2, 1.5, "/tmp/sweep-work")
    with pytest.raises(ValueError, match="extra_verifier_args"):
        ComposeConfig.from_services(ServicesConfig(BackendConfig(), TOY, extra_verifier_args=("--max-gamma", "8")))
