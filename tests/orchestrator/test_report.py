"""`dsdbed report` on a small sim sweep: one self-contained HTML file, or Markdown beside the PNGs."""
import base64
import json
import re

import pandas as pd
import pytest

from orchestrator.cli import main
from orchestrator.experiment import experiment_from_dict
from orchestrator.report import write_report
from orchestrator.run import run_experiment


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "small"
    experiment = experiment_from_dict({
        "name": "small-report", "profile": "toy-edge-cloud", "rtt_ms": [0, 10, 20], "gamma": [4],
        "requests": 2, "max_new_tokens": 40, "prompt_tokens": 8, "backend": {"kind": "synthetic", "alpha": 0.8}})
    run_experiment(experiment, out, resume=False)
    return out


def test_html_report_is_self_contained_and_names_what_ran(sweep):
    path = write_report(sweep, "html")          # analyzes first: summary.json is not there yet
    assert path == sweep / "report.html" and (sweep / "summary.json").exists()
    text = path.read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "src='http" not in text and "<link" not in text
    sidecar = json.loads((sweep / "sweep.json").read_text())
    for expected in ("small-report", "sim", "none (virtual link)", sidecar["git_commit"], "sync vs ar",
                     "t_verify_ms (gamma=4)", "Points"):
        assert expected in text, expected
    points = pd.read_csv(sweep / "points.csv")
    assert text.count("<tr>") >= len(points) + 1


def test_markdown_report_links_the_pngs_beside_it(sweep):
    path = write_report(sweep, "md")
    text = path.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links == ["latency_vs_rtt.png"] and (path.parent / links[0]).exists()
    assert "| experiment | small-report |" in text


def test_report_command_and_its_errors(sweep, tmp_path, capsys):
    assert main(["report", str(sweep), "--format", "md"]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main(["report", str(tmp_path)]) == 2
    assert "not a sweep folder" in capsys.readouterr().err
