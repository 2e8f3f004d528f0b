"""The sim launcher replays a link schedule of RTT steps on virtual time (the measured traces'
experiments run there in seconds), and refuses what it cannot replay."""

import pandas as pd
import pytest

from netem.schedule import LinkSchedule
from orchestrator.cli import main
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.launchers.sim import rtt_schedule_s
from orchestrator.links.keys import check_launcher

BASE = {
    "name": "s",
    "launcher": "sim",
    "modes": ["sync"],
    "rtt_ms": [10],
    "gamma": [3],
    "requests": 6,
    "warmup_requests": 0,
    "max_new_tokens": 16,
    "prompt_tokens": 8,
    "profile": "toy-edge-cloud",
    "backend": {"kind": "synthetic", "alpha": 0.7},
}


def test_the_rtt_at_a_time_is_the_last_step_before_it_and_the_base_before_the_first():
    rtt_at = rtt_schedule_s(LinkSchedule.from_steps([{"at_s": 1, "rtt_ms": 100}, {"at_s": 2.5, "rtt_ms": 40}]), 10)
    assert [rtt_at(t) for t in (0, 0.99, 1.0, 2.4, 2.5, 99)] == pytest.approx([0.01, 0.01, 0.1, 0.1, 0.04, 0.04])


def test_the_sim_refuses_a_schedule_that_changes_more_than_the_rtt():
    lossy = experiment_from_dict({**BASE, "link": {"schedule": [{"at_s": 1, "loss_pct": 100}]}})
    with pytest.raises(ValueError, match="only rtt_ms steps on the sim launcher"):
        check_launcher(lossy, "sim")
    check_launcher(experiment_from_dict({**BASE, "link": {"schedule": [{"at_s": 1, "rtt_ms": 500}]}}), "sim")


def test_requests_after_a_step_to_a_long_rtt_take_its_time_on_the_sim(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text(
        'name = "s"\nlauncher = "sim"\nmodes = ["sync"]\nrtt_ms = [10]\ngamma = [3]\nrequests = 6\n'
        'warmup_requests = 0\nmax_new_tokens = 16\nprompt_tokens = 8\nprofile = "toy-edge-cloud"\n'
        '[backend]\nkind = "synthetic"\nalpha = 0.7\n[[link.schedule]]\nat_s = 0.4\nrtt_ms = 2000\n'
    )
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 0
    requests = pd.read_csv(tmp_path / "out" / "requests.csv").sort_values("request_index")
    starts = requests["wall_s"].cumsum() - requests["wall_s"]
    before, after = requests[starts + requests["wall_s"] < 0.4], requests[starts >= 0.4]
    assert len(before) and len(after)
    assert before["wall_s"].max() < 0.5 and after["wall_s"].min() > 2.0  # at least one 2-s round trip each
