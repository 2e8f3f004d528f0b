"""A run under a link schedule on one time axis (orchestrator/links/timeline.py): where each request
ran and its per-token latency, beside the link's RTT; the report draws them."""

import base64
import re

import pandas as pd
import pytest

from orchestrator.links.timeline import request_times, schedule_rtt_ms
from orchestrator.report.html import write_report
from orchestrator.running.run import run_experiment
from orchestrator.spec.experiment import experiment_from_dict


def test_the_link_is_the_points_rtt_then_each_step_that_sets_the_rtt():
    experiment = {
        "rtt_ms": [10],
        "link": {
            "schedule": {
                "steps": [
                    {"at_s": 1.0, "changes": [["rtt_ms", 100.0]]},
                    {"at_s": 2.0, "changes": [["loss_pct", 5.0]]},
                    {"at_s": 3.0, "changes": [["rtt_ms", 20.0]]},
                ]
            }
        },
    }
    assert schedule_rtt_ms(experiment) == [(0.0, 10.0), (1.0, 100.0), (3.0, 20.0)]
    assert schedule_rtt_ms({"rtt_ms": [10], "link": {}}) == []
    assert schedule_rtt_ms({**experiment, "rtt_ms": [10, 20]}) == []  # each point its own start


def test_sim_requests_run_back_to_back_from_the_schedules_start():
    requests = pd.DataFrame(
        {
            "point": ["p"] * 3,
            "mode": ["sync"] * 3,
            "gamma": [4] * 3,
            "request_index": [2, 0, 1],
            "wall_s": [0.5, 1.0, 2.0],
            "tokens": [10, 20, 40],
            "t_start_s": [None] * 3,
        }
    )
    times = request_times(requests, pd.DataFrame(), warmup_requests=0)
    assert times["t_s"].tolist() == [0.0, 1.0, 3.0]
    assert times["per_token_ms"].tolist() == pytest.approx([50.0, 50.0, 50.0])
    # warm-up requests ran first and their rows are gone: where the first kept one began is unknown
    assert request_times(requests, pd.DataFrame(), warmup_requests=2).empty


def test_network_requests_are_placed_by_their_clock_against_the_schedules_start():
    requests = pd.DataFrame(
        {
            "point": ["p", "p", "q"],
            "mode": ["ar"] * 3,
            "gamma": [1] * 3,
            "request_index": [0, 1, 0],
            "wall_s": [1.0, 1.0, 1.0],
            "tokens": [8, 8, 8],
            "t_start_s": [1000.5, 1001.5, 2000.0],
        }
    )
    # point p's schedule started at 1000.0 (its change at 2 s took effect at 1002.0); q has no change
    links = pd.DataFrame(
        {
            "point": ["p", "p", "q"],
            "change_index": [0, 1, 0],
            "change_at_s": [None, 2.0, None],
            "change_t_unix_s": [None, 1002.0, None],
        }
    )
    times = request_times(requests, links, warmup_requests=0)
    assert times["point"].tolist() == ["p", "p"] and times["t_s"].tolist() == pytest.approx([0.5, 1.5])


def test_the_report_of_a_sweep_under_a_link_schedule_draws_the_link_and_each_modes_latency(tmp_path):
    out = tmp_path / "sched"
    experiment = experiment_from_dict(
        {
            "name": "sched",
            "launcher": "sim",
            "modes": ["ar", "sync"],
            "rtt_ms": [10],
            "gamma": [3],
            "requests": 4,
            "warmup_requests": 0,
            "max_new_tokens": 16,
            "prompt_tokens": 8,
            "profile": "toy-edge-cloud",
            "backend": {"kind": "synthetic", "alpha": 0.7},
            "link": {"schedule": [{"at_s": 0.2, "rtt_ms": 300}]},
        }
    )
    run_experiment(experiment, out, resume=False)
    text = write_report(out, "html").read_text()
    assert "alt='latency_over_link.png'" in text
    png = re.search(r"alt='latency_over_link.png' src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text).group(1)
    assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
