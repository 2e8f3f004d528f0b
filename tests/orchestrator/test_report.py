"""`dsdbed report` on a small sim sweep: one self-contained HTML file, or Markdown beside the PNGs."""

import base64
import json
import re

import pandas as pd
import pytest

from orchestrator.cli import main
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.report.html import write_report
from orchestrator.running.run import run_experiment


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "small"
    experiment = experiment_from_dict(
        {
            "name": "small-report",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0, 10, 20],
            "gamma": [4],
            "requests": 2,
            "max_new_tokens": 40,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic", "alpha": 0.8},
        }
    )
    run_experiment(experiment, out, resume=False)
    return out


def test_html_report_is_self_contained_and_names_what_ran(sweep):
    path = write_report(sweep, "html")  # analyzes first: summary.json is not there yet
    assert path == sweep / "report.html" and (sweep / "summary.json").exists()
    text = path.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 2 and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert "src='http" not in text and "<link" not in text
    sidecar = json.loads((sweep / "sweep.json").read_text())
    for expected in (
        "small-report",
        "sim",
        "none (virtual link)",
        sidecar["git_commit"],
        "sync vs ar",
        "t_verify_ms (gamma=4)",
        "Points",
        "Workload: acceptance and repetition",
        "alpha over requests p10 / p50 / p90",
    ):
        assert expected in text, expected
    points = pd.read_csv(sweep / "points.csv")
    assert text.count("<tr>") >= len(points) + 1


def test_markdown_report_links_the_pngs_beside_it(sweep):
    path = write_report(sweep, "md")
    text = path.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links == ["latency_vs_rtt.png", "acceptance.png"] and all((path.parent / link).exists() for link in links)
    assert "| experiment | small-report |" in text


def test_report_command_and_its_errors(sweep, tmp_path, capsys):
    assert main(["report", str(sweep), "--format", "md"]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main(["report", str(tmp_path)]) == 2
    assert "not a sweep folder" in capsys.readouterr().err


def test_accepted_tokens_per_round_of_iid_acceptance_follow_the_truncated_geometric(tmp_path):
    """The synthetic draft is right with probability alpha per position, independently: the
    measured shares of accepted counts must sit on the geometric the report draws beside them."""
    from orchestrator.report.analyze import analyze_sweep

    out = tmp_path / "iid"
    experiment = experiment_from_dict(
        {
            "name": "iid",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0],
            "modes": ["sync"],
            "requests": 24,
            "max_new_tokens": 60,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic", "alpha": 0.7},
        }
    )
    run_experiment(experiment, out, resume=False)
    acceptance = analyze_sweep(out)["acceptance"]
    measured, iid = acceptance["accepted_share"], acceptance["accepted_share_iid"]
    assert len(measured) == len(iid) == 5 and sum(iid) == pytest.approx(1.0)
    assert max(abs(m - g) for m, g in zip(measured, iid)) < 0.08, (measured, iid)
    assert 0.55 < acceptance["request_alpha_p50"] < 0.85
    assert (out / "acceptance.png").exists()
    requests = pd.read_csv(out / "requests.csv")
    assert {"alpha_measured", "distinct_4gram"} <= set(requests.columns)
    assert requests["alpha_measured"].between(0, 1).all()
