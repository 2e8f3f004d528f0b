"""The edge's HTTP API refuses a bad run with a message naming the field, never overwrites a
run, records a failed run as rows, and the verifier's /metrics tells what it served."""

import pytest

from services.edge import RunConfig
from tests.services.harness import post_runs, read_csv, synthetic_args, wait_for_runs

GOOD = {
    "run_id": "r1",
    "client_id": "c",
    "mode": "sync",
    "gamma": 2,
    "prompts": [[1, 2]],
    "max_new_tokens": 4,
    "verifier_url": "http://127.0.0.1:1",
}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"mode": "beam"}, "mode"),
        ({"gamma": 0}, "gamma"),
        ({"gamma": 2.5}, "gamma"),
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"prompts": []}, "prompts"),
        ({"prompts": [[]]}, "prompts"),
        ({"prompts": [[1, -2]]}, "prompts"),
        ({"temperature": -0.1}, "temperature"),
        ({"app_delay_ms": float("nan")}, "app_delay_ms"),
        ({"run_id": "../x"}, "run_id"),
        ({"verifier_url": "ftp://x"}, "verifier_url"),
        ({"gamme": 3}, "gamme"),
        ({"seed": True}, "seed"),
    ],
)
def test_run_config_errors_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        RunConfig.from_json({**GOOD, **change})


def test_missing_fields_are_named():
    with pytest.raises(ValueError, match="verifier_url"):
        RunConfig.from_json({k: v for k, v in GOOD.items() if k != "verifier_url"})


@pytest.fixture(scope="module")
def services(spawn, tmp_path_factory):
    return spawn(
        ("services.verifier", synthetic_args()),
        ("services.edge", synthetic_args() + ["--out-dir", str(tmp_path_factory.mktemp("edge"))]),
    )


def test_http_api_answers_bad_runs_duplicates_and_unknown_ids(services):
    verifier, edge = services
    status, body = edge.post_json("/runs", {**GOOD, "mode": "beam"})
    assert status == 400 and "mode" in body["error"]
    ok = {**GOOD, "run_id": "api-ok", "verifier_url": verifier.url}
    assert post_runs(edge, [ok]) == ["api-ok"]
    status, body = edge.post_json("/runs", ok)
    assert status == 409 and "exists" in body["error"]
    assert wait_for_runs(edge, ["api-ok"])["api-ok"]["status"] == "done"
    assert edge.get_json("/health")["runs"] == {"done": 1}
    status = edge.post_json("/runs", {**ok, "run_id": "x", "gamma": 0})[0]
    assert status == 400
    with pytest.raises(Exception, match="404"):
        edge.get_json("/runs/nope")


def test_a_run_that_cannot_reach_the_verifier_fails_with_error_rows(services):
    edge = services[1]
    post_runs(edge, [{**GOOD, "run_id": "unreachable"}])  # port 1: nothing listens
    summary = wait_for_runs(edge, ["unreachable"])["unreachable"]
    assert summary["status"] == "failed" and summary["error"]
    [row] = read_csv(edge, "unreachable", "requests.csv")
    assert row["error"] and row["token_ids"] == ""
    assert read_csv(edge, "unreachable", "rounds.csv")[0]["error"]


def test_a_verifier_refusal_ends_the_run_with_its_message(services):
    verifier, edge = services
    post_runs(edge, [{**GOOD, "run_id": "too-long", "verifier_url": verifier.url, "max_new_tokens": 10**6}])
    summary = wait_for_runs(edge, ["too-long"])["too-long"]
    assert summary["status"] == "failed" and "max_new_tokens" in summary["error"]


@pytest.mark.parametrize("mode", ["sync", "ar"])
def test_a_request_not_done_within_its_timeout_fails_the_run_naming_it(services, mode):
    verifier, edge = services
    run_id = f"slow-{mode}"
    post_runs(
        edge,
        [
            {
                **GOOD,
                "run_id": run_id,
                "verifier_url": verifier.url,
                "mode": mode,
                "max_new_tokens": 400,
                "request_timeout_s": 0.05,
            }
        ],
    )
    summary = wait_for_runs(edge, [run_id])[run_id]
    assert summary["status"] == "failed" and "request 0: not done within request_timeout_s 0.05" in summary["error"]
    [row] = read_csv(edge, run_id, "requests.csv")
    assert "request_timeout_s" in row["error"]
    ok = {**GOOD, "run_id": f"after-{run_id}", "verifier_url": verifier.url}  # the edge serves on
    assert wait_for_runs(edge, post_runs(edge, [ok]))[ok["run_id"]]["status"] == "done"


def test_metrics_report_sessions_rounds_batches_and_busy_time(services):
    verifier, edge = services
    run = {**GOOD, "run_id": "metrics", "verifier_url": verifier.url, "mode": "ar", "max_new_tokens": 6}
    wait_for_runs(edge, post_runs(edge, [run]))
    metrics = verifier.get_json("/metrics")
    assert metrics["sessions_open"] == 0 and metrics["sessions_total"] >= 1
    assert metrics["rounds"]["ar"] >= 6 and metrics["busy_s"] > 0
    assert metrics["batch_sizes"]["1"] >= 6 and metrics["limits"]["max_gamma"] == 32
