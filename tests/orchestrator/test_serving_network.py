"""Open-loop serving on the services (loopback processes): the edges issue requests at their
arrival times while the verifier saturates, and a request refused by admission is a row with its
reason."""

import json

import pandas as pd
import pytest

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.open_loop.plan import ServingPoint, arrivals_for
from orchestrator.open_loop.sweep import run_serving

pytestmark = pytest.mark.slow


def experiment(keys=None, **load):
    return experiment_from_dict(
        {
            "name": "serve-net",
            "launcher": "loopback",
            "modes": ["ar"],
            "profile": "toy-edge-cloud",
            "edges": 2,
            "rtt_ms": [10],
            "max_new_tokens": 16,
            "prompt_tokens": 8,
            "retries": 0,
            "backend": {"kind": "synthetic", "alpha": 0.8},
            "load": {"rate_rps": [18.0], "duration_s": 3, **load},
            "slo": {"ttft_ms": 200, "attainment": 0.9},
            **(keys or {}),
        }
    )


def test_loopback_arrivals_keep_their_times_when_the_verifier_saturates(tmp_path):
    # cloud AR takes 16 x 10 ms of the device per request: saturated above ~6 requests/s
    exp = experiment()
    run_serving(exp, tmp_path / "out")
    rows = pd.read_csv(tmp_path / "out" / "requests.csv")
    scheduled = [a.arrival_s for a in arrivals_for(exp, ServingPoint("ar", 18.0, 4, 0))]
    assert list(rows["arrival_s"]) == pytest.approx(scheduled) and rows["admitted"].all()
    # requests started at their arrivals, not when earlier ones finished: many ran at once
    # (closed-loop clients on 2 edges never have more than 2), each started after its arrival
    # and, on a busy 2-core host, typically within a few tenths of a second of it
    start_s = rows["arrival_s"] + rows["start_lag_s"]
    end_s = rows["arrival_s"] + rows["e2e_s"]
    in_flight = max(((start_s <= t) & (end_s > t)).sum() for t in start_s)
    assert in_flight >= 6
    assert (rows["start_lag_s"] >= -0.01).all() and rows["start_lag_s"].median() < 0.5
    # the verifier's queue absorbs the load instead: a request's own work is 0.16 s of passes,
    # its queueing many times that, and a later arrival waits longer for its first token
    assert rows["queue_s"].median() > 1.0
    assert rows.tail(10)["ttft_s"].mean() > 3 * rows.head(5)["ttft_s"].mean()


def test_loopback_refused_requests_are_rows_with_their_reason(tmp_path):
    exp = experiment(max_sessions=1, rate_rps=[10.0])
    run_serving(exp, tmp_path / "out")
    rows = pd.read_csv(tmp_path / "out" / "requests.csv", keep_default_na=False)
    assert len(rows) == len(arrivals_for(exp, ServingPoint("ar", 10.0, 4, 0)))
    refused = rows[rows["admitted"].astype(str) == "False"]
    assert len(refused) > 0 and set(refused["refused_reason"]) == {"limit max_sessions"}
    assert (rows[rows["admitted"].astype(str) == "True"]["tokens"] == 16).all()


def test_an_open_loop_run_samples_as_its_sampling_table_says(tmp_path):
    """Each request's edge run gets the [sampling] setting (request i: its seed + i) and the point
    settings of a closed-loop sweep; open-loop runs once went greedy whatever [sampling] said."""
    exp = experiment(
        {"modes": ["sync"], "sampling": {"temperature": 0.8, "top_k": 5, "seed": 7}, "request_deadline_s": 30.0},
        rate_rps=[4.0],
        duration_s=0,
        requests=4,
    )
    run_serving(exp, tmp_path / "out")
    runs = [json.loads(path.read_text())["run"] for path in (tmp_path / "out" / "services").rglob("run.json")]
    assert len(runs) == 4
    assert {(r["temperature"], r["top_k"], r["request_deadline_s"]) for r in runs} == {(0.8, 5, 30.0)}
    assert sorted(r["seed"] for r in runs) == [7, 8, 9, 10]
    rows = pd.read_csv(tmp_path / "out" / "requests.csv")
    assert len(rows) == 4 and rows["admitted"].all() and set(rows["temperature"]) == {0.8}
