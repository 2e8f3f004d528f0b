"""A categorized workload (jsonl lines with a category) through a real sim sweep: every request
row carries its prompt's category, summary.json breaks acceptance and latency down by it, and
report.html shows the table."""

import json

import pandas as pd
import pytest

from orchestrator.analysis.categories import by_category
from orchestrator.report.analyze import analyze_sweep
from orchestrator.report.html import write_report
from orchestrator.running.run import run_experiment
from orchestrator.spec.experiment import experiment_from_dict
from services.edge.config import RunConfig

CATEGORIES = ["math", "coding", "math", "translation", "coding", "math"]


def categorized_sweep(tmp_path, clients: int = 1):
    workload = tmp_path / "mix.jsonl"
    workload.write_text(
        "".join(json.dumps({"prompt": f"item {i}", "category": c}) + "\n" for i, c in enumerate(CATEGORIES))
    )
    experiment = experiment_from_dict(
        {
            "name": "categories",
            "launcher": "sim",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0, 20],
            "modes": ["ar", "sync"],
            "gamma": [4],
            "requests": len(CATEGORIES),
            "warmup_requests": 0,
            "clients": [clients],
            "max_new_tokens": 24,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic", "alpha": 0.7},
            "workload": {"source": "jsonl", "path": str(workload)},
        }
    )
    out = tmp_path / "sweep"
    run_experiment(experiment, out, resume=False)
    return out


@pytest.mark.parametrize("clients", [1, 2])
def test_every_request_row_carries_its_prompts_category(tmp_path, clients):
    out = categorized_sweep(tmp_path, clients)
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == 4 * clients * len(CATEGORIES)  # 2 RTTs x 2 modes
    assert list(requests["category"]) == [CATEGORIES[i] for i in requests["request_index"]]


def test_summary_and_report_break_acceptance_and_latency_down_by_category(tmp_path):
    out = categorized_sweep(tmp_path)
    summary = analyze_sweep(out)
    rows = summary["by_category"]
    assert sorted(rows) == ["coding", "math", "translation"]
    assert [rows[c]["requests"] for c in ("coding", "math", "translation")] == [8, 12, 4]
    for row in rows.values():
        assert 0.4 < row["alpha_measured"] < 0.95  # synthetic alpha 0.7, a few rounds
        assert sorted(row["steady_per_token_ms_mean"]) == ["ar", "sync"]
        assert all(v > 0 for v in row["steady_per_token_ms_mean"].values())
    assert json.loads((out / "summary.json").read_text())["by_category"]["math"]["requests"] == 12
    html = write_report(out, "html").read_text()
    assert "Acceptance and latency by category" in html and "translation" in html


def test_by_category_pools_only_its_own_speculative_rounds():
    requests = pd.DataFrame(
        {
            "run_id": ["a", "a", "b"],
            "request_index": [0, 1, 0],
            "mode": ["sync", "sync", "ar"],
            "category": ["x", "y", "x"],
            "steady_per_token_s": [0.01, 0.02, 0.03],
            "error": [None] * 3,
        }
    )
    rounds = pd.DataFrame(
        {
            "run_id": ["a"] * 4 + ["b"],
            "request_index": [0, 0, 1, 1, 0],
            "mode": ["sync"] * 4 + ["ar"],
            "proposed": [4, 4, 4, 4, 0],
            "accepted": [4, 2, 0, 1, 0],
            "stale": [False] * 5,
        }
    )
    rows = by_category(requests, rounds)
    assert rows["x"]["alpha_measured"] == pytest.approx(6 / 7)  # 6 accepted, one rejection
    assert rows["y"]["alpha_measured"] == pytest.approx(1 / 3)
    assert rows["x"]["steady_per_token_ms_mean"] == pytest.approx({"sync": 10.0, "ar": 30.0})
    assert rows["x"]["requests"] == 2


def test_a_run_with_categories_not_one_per_prompt_is_refused():
    with pytest.raises(ValueError, match="categories must be empty or one string per prompt"):
        RunConfig(
            run_id="r",
            client_id="0",
            mode="sync",
            gamma=4,
            prompts=((1, 2), (3,)),
            max_new_tokens=4,
            verifier_url="ws://x",
            categories=("math",),
        )


def test_a_network_edge_run_takes_the_points_categories_from_its_settings():
    from orchestrator.launchers.base import PointSettings
    from orchestrator.launchers.control_api import run_body

    settings = PointSettings(warmup=0, max_new_tokens=4, max_in_flight=1, categories=("math", "coding"))
    body = run_body(
        settings,
        run_id="r",
        client_id="0",
        mode="sync",
        gamma=4,
        sampling={},
        prompts=[[1, 2], [3]],
        max_new_tokens=4,
        verifier_url="ws://x",
    )
    assert RunConfig.from_json(body).categories == ("math", "coding")
    assert "categories" not in PointSettings(warmup=0, max_new_tokens=4, max_in_flight=1).run_fields()
    from services.edge.runs import category_of

    config = RunConfig.from_json(body)
    assert [category_of(config, i) for i in range(3)] == ["math", "coding", ""]  # an API request's index past them
