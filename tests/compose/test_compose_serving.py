"""Open-loop serving on the compose testbed: the edge containers issue each request at its
arrival time while the verifier saturates, every edge's link is shaped to its own RTT, and the
admission limit the experiment sets reaches the verifier container (a refused request is a row
with its reason). The sweep brings its own project up and takes it down."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from netem.cleanup import find_leftovers
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.open_loop.plan import ServingPoint, arrivals_for
from orchestrator.open_loop.sweep import run_serving
from tests.compose.host import project_containers

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]


def experiment(**load):
    return experiment_from_dict(
        {
            "name": "serve-compose",
            "launcher": "compose",
            "modes": ["ar"],
            "profile": "toy-edge-cloud",
            "edges": 2,
            "rtt_ms": [10],
            "max_new_tokens": 16,
            "prompt_tokens": 8,
            "retries": 0,
            "backend": {"kind": "synthetic", "alpha": 0.8},
            "link": {"edges": [{"rtt_ms": 10}, {"rtt_ms": 60}]},
            "load": {"rate_rps": [18.0], "duration_s": 3, **load},
            "slo": {"ttft_ms": 200, "attainment": 0.9},
        }
    )


def test_compose_arrivals_keep_their_times_on_per_edge_links_and_refusals_are_rows(docker_engine, tmp_path):
    assert project_containers() == [], "a dsdbed compose project is up already: `docker compose down` it first"
    exp = experiment(max_sessions=4)
    run_serving(exp, tmp_path / "out")
    rows = pd.read_csv(tmp_path / "out" / "requests.csv", keep_default_na=False)
    scheduled = [a.arrival_s for a in arrivals_for(exp, ServingPoint("ar", 18.0, 4, 0))]
    assert list(rows["arrival_s"].astype(float)) == pytest.approx(scheduled)  # none lost
    admitted = rows[rows["admitted"].astype(str) == "True"]
    refused = rows[rows["admitted"].astype(str) == "False"]
    # cloud AR takes 16 x 10 ms of the device per request: at 18 requests/s the open sessions pass
    # the limit of 4, and the verifier container refuses with the limit's name
    assert len(refused) > 0 and set(refused["refused_reason"]) == {"limit max_sessions"}
    assert len(admitted) > 0 and (admitted["tokens"].astype(int) == 16).all()
    # started at their arrivals, not when earlier ones finished
    assert (admitted["start_lag_s"].astype(float) >= -0.01).all()
    assert admitted["start_lag_s"].astype(float).median() < 0.5
    links = {int(e): float(r) for e, r in zip(rows["edge"], rows["link_rtt_configured_ms"])}
    assert links == {0: 10.0, 1: 60.0}
    # each container's link was shaped to its own RTT (edge i is container number i + 1) and
    # measured so (a busy host only adds)
    links = pd.read_csv(tmp_path / "out" / "links.csv")
    assert sorted(zip(links["edge"], links["rtt_configured_ms"])) == [("dsdbed-edge-1", 10.0), ("dsdbed-edge-2", 60.0)]
    excess_ms = links["rtt_measured_p50_ms"] - links["rtt_configured_ms"]
    assert excess_ms.between(-0.5, 3.0).all(), links[["edge", "rtt_configured_ms", "rtt_measured_p50_ms"]]
    testbed = json.loads((tmp_path / "out" / "sweep.json").read_text())["testbed"]
    assert (testbed["launcher"], testbed["adopted"], len(testbed["edges"])) == ("compose", False, 2)
    assert project_containers() == [] and find_leftovers() == []  # brought up, and down
