"""Suite files: several experiments run as one job, each into a folder of its own, and set side by
side in one summary, figure and report; bad suites are refused before anything runs."""

import json

import pytest

from orchestrator.cli import main
from orchestrator.records.suite_folder import sweep_crossovers
from orchestrator.spec.suite import is_suite_file, load_suite

EXPERIMENT_TEXT = (
    'name = "{name}"\nlauncher = "sim"\nmodes = ["ar", "sync"]\nrtt_ms = [0, 20, 40]\ngamma = [3]\n'
    "requests = 6\nwarmup_requests = 0\nmax_new_tokens = 16\nprompt_tokens = 8\n"
    'profile = "toy-edge-cloud"\n[backend]\nkind = "synthetic"\nalpha = {alpha}\n'
)


def _suite(tmp_path, names=("low", "high"), alphas=(0.3, 0.9), extra="") -> str:
    for name, alpha in zip(names, alphas):
        (tmp_path / f"{name}.toml").write_text(EXPERIMENT_TEXT.format(name=name, alpha=alpha) + extra)
    files = ", ".join(f'"{name}.toml"' for name in names)
    path = tmp_path / "suite.toml"
    path.write_text(f'name = "both"\nexperiments = [{files}]\n')
    return str(path)


def test_a_suite_runs_each_experiment_into_its_folder_and_sets_them_side_by_side(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["sweep", _suite(tmp_path), "--out", str(out)]) == 0
    for name in ("low", "high"):
        assert (out / name / "requests.csv").exists() and (out / name / "summary.json").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["suite"] == "both" and [r["experiment"] for r in summary["runs"]] == ["low", "high"]
    low, high = summary["runs"]
    assert low["alpha_measured"] < high["alpha_measured"]
    # each run's crossovers are its own sweep's, with their intervals
    for run in (low, high):
        own = json.loads((out / run["folder"] / "summary.json").read_text())["crossovers"]
        assert run["crossovers"] == own and "sync_vs_ar" in own and "ci_low" in own["sync_vs_ar"]
    # with alpha 0.9 sync DSD beats cloud AR up to a longer round trip than with alpha 0.3
    assert high["crossovers"]["sync_vs_ar"]["measured_rtt_ms"] > low["crossovers"]["sync_vs_ar"]["measured_rtt_ms"]
    assert (out / "latency_vs_rtt.png").stat().st_size > 10_000
    report = (out / "report.html").read_text()
    assert "low/report.html" in report and "data:image/png;base64" in report
    assert "suite both, side by side" in capsys.readouterr().out
    # what the benchmarks read: a suite's sweep by its pair (synthetic sweeps have none), or a sweep's own
    assert sweep_crossovers(out) == low["crossovers"] and sweep_crossovers(out / "high") == high["crossovers"]
    assert sweep_crossovers(out, pair="no-such-pair") == {}


def test_a_finished_suite_is_kept_unless_resumed_and_analyze_rewrites_its_summary(tmp_path, capsys):
    suite, out = _suite(tmp_path), tmp_path / "out"
    assert main(["sweep", suite, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["sweep", suite, "--out", str(out)]) == 2
    assert "already holds a suite; pass --resume" in capsys.readouterr().err
    before = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    assert main(["analyze", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["runs"] == before["runs"]
    assert main(["sweep", suite, "--out", str(out), "--resume"]) == 0


def test_a_suite_whose_second_sweep_did_not_run_resumes_there(tmp_path):
    suite, out = _suite(tmp_path), tmp_path / "out"
    assert main(["sweep", str(tmp_path / "low.toml"), "--out", str(out / "low")]) == 0
    requests_before = (out / "low" / "requests.csv").read_text()
    (out / "suite.json").write_text(
        json.dumps(
            {
                "suite": "both",
                "experiments": [{"name": n, "file": str(tmp_path / f"{n}.toml"), "folder": n} for n in ("low", "high")],
            }
        )
    )
    assert main(["sweep", suite, "--out", str(out), "--resume"]) == 0
    assert (out / "low" / "requests.csv").read_text() == requests_before  # nothing of it ran again
    assert len(json.loads((out / "summary.json").read_text())["runs"]) == 2


def test_a_suite_dry_run_prints_each_plan(tmp_path, capsys):
    assert main(["sweep", _suite(tmp_path), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("points, launcher sim") == 2 and str(tmp_path / "out" / "high") in printed
    assert not (tmp_path / "out").exists()


def test_a_launcher_given_for_a_suite_moves_its_measured_members_and_leaves_the_emulated_ones(tmp_path, capsys):
    suite = _suite(tmp_path)
    measured = tmp_path / "low.toml"
    measured.write_text(measured.read_text().replace('launcher = "sim"', 'launcher = "auto"'))
    assert main(["sweep", suite, "--out", str(tmp_path / "out"), "--dry-run", "--launcher", "loopback"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("points, launcher loopback") == 1 and captured.out.count("points, launcher sim") == 1
    assert "high stays on the sim launcher" in captured.err


@pytest.mark.parametrize(
    "text, problem",
    [
        ('name = "s"\nexperiments = ["missing.toml"]\n', "experiment files that exist"),
        ('name = "s"\nexperiments = []\n', "a non-empty list of experiment files"),
        ('name = "s"\nexperiments = "a.toml"\n', "expected a list of experiment file paths"),
        ('name = "a b"\nexperiments = ["a.toml"]\n', "1-64 of"),
        ('name = "s"\nexperiments = ["a.toml", "a.toml"]\n', "each experiment file once"),
        ('name = "s"\nexperiments = ["a.toml"]\nrtt_ms = [0]\n', "unknown key(s) ['rtt_ms'] in a suite file"),
        ('experiments = ["a.toml"]\n', "missing key 'name'"),
    ],
)
def test_a_bad_suite_file_is_refused_with_the_key_at_fault(tmp_path, text, problem):
    (tmp_path / "a.toml").write_text(EXPERIMENT_TEXT.format(name="a", alpha=0.5))
    path = tmp_path / "suite.toml"
    path.write_text(text)
    assert is_suite_file(path)
    with pytest.raises(ValueError, match="suite.toml") as error:
        load_suite(path)
    assert problem in str(error.value)


def test_an_experiment_file_is_not_a_suite(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text(EXPERIMENT_TEXT.format(name="a", alpha=0.5))
    assert not is_suite_file(path)


def test_a_suite_whose_experiments_share_a_name_is_refused_before_anything_runs(tmp_path, capsys):
    _suite(tmp_path)
    (tmp_path / "high.toml").write_text(EXPERIMENT_TEXT.format(name="low", alpha=0.9))
    assert main(["sweep", str(tmp_path / "suite.toml"), "--out", str(tmp_path / "out")]) == 2
    assert "names ['low', 'low'] repeat" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_main_job_is_a_suite_of_the_layer_and_the_feature_draft_and_the_map():
    from orchestrator.cli import REPO

    suite = load_suite(REPO / "experiments" / "main.toml")
    assert [p.name for p in suite.experiments] == ["crossover.toml", "crossover-feature.toml", "regime-map-field.toml"]


def test_a_suite_member_over_several_client_counts_brings_its_map_to_the_side_by_side(tmp_path):
    (tmp_path / "one.toml").write_text(EXPERIMENT_TEXT.format(name="one", alpha=0.8))
    (tmp_path / "map.toml").write_text(
        EXPERIMENT_TEXT.format(name="map", alpha=0.8)
        .replace('modes = ["ar", "sync"]', 'modes = ["colocated", "pipelined"]')
        .replace("rtt_ms = [0, 20, 40]", "rtt_ms = [0, 10, 40, 80, 160]\nclients = [1, 2, 4]\nedges = 4")
        .replace("requests = 6", "requests = 2")
    )
    (tmp_path / "suite.toml").write_text('name = "with-map"\nexperiments = ["one.toml", "map.toml"]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(tmp_path / "suite.toml"), "--out", str(out)]) == 0
    one, mapped = json.loads((out / "summary.json").read_text())["runs"]
    assert one["frontier"] == [] and one["map_plots"] == []
    assert {row["clients"] for row in mapped["frontier"]} == {1, 2, 4}
    assert mapped["map_plots"] == ["map/frontier.png", "map/regime_map.png"]
    report = (out / "report.html").read_text()
    assert "The RTT x clients map" in report and "pipelined_vs_colocated" in report
