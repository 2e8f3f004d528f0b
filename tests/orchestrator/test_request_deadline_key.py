"""The experiment key request_deadline_s: checked on load and handed to every edge run."""

import pytest

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.running.run import point_settings


def test_the_deadline_is_checked_and_reaches_the_point_settings():
    experiment = experiment_from_dict(
        {"name": "d", "launcher": "netns", "profile": "toy-edge-cloud", "request_deadline_s": 20}
    )
    assert point_settings(experiment).request_deadline_s == 20
    assert point_settings(experiment_from_dict({"name": "d", "profile": "toy-edge-cloud"})).request_deadline_s == 0.0
    for bad in (-1, "20", float("inf")):
        with pytest.raises(ValueError, match="request_deadline_s"):
            experiment_from_dict({"name": "d", "profile": "toy-edge-cloud", "request_deadline_s": bad})


def test_the_backoff_cap_reaches_the_runs_and_the_verifier_and_is_checked():
    from orchestrator.running.run import verifier_link_args

    experiment = experiment_from_dict(
        {"name": "d", "launcher": "netns", "profile": "toy-edge-cloud", "tcp_rto_max_ms": 1000}
    )
    assert point_settings(experiment).tcp_rto_max_ms == 1000
    assert verifier_link_args(experiment) == ("--tcp-rto-max-ms", "1000")
    assert verifier_link_args(experiment_from_dict({"name": "d", "profile": "toy-edge-cloud"})) == ()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="tcp_rto_max_ms"):
            experiment_from_dict({"name": "d", "profile": "toy-edge-cloud", "tcp_rto_max_ms": bad})
