"""The experiment key request_deadline_s: checked on load and handed to every edge run."""
import pytest

from orchestrator.experiment import experiment_from_dict
from orchestrator.run import point_settings


def test_the_deadline_is_checked_and_reaches_the_point_settings():
    experiment = experiment_from_dict({"name": "d", "launcher": "netns", "profile": "toy-edge-cloud", "request_deadline_s": 20})
    assert point_settings(experiment).request_deadline_s == 20
    assert point_settings(experiment_from_dict({"name": "d", "profile": "toy-edge-cloud"})).request_deadline_s == 0.0
    for bad in (-1, "20", float("inf")):
        with pytest.raises(ValueError, match="request_deadline_s"):
            experiment_from_dict({"name": "d", "profile": "toy-edge-cloud", "request_deadline_s": bad})
