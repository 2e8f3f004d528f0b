"""Bad input through the real CLI: every mistake gets one line on stderr naming the key or the
argument, a non-zero exit, and nothing starts (no output folder, no network namespace)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.faults import TALLY

REPO = Path(__file__).resolve().parents[2]
GOOD = """name = "bad-input"
launcher = "netns"
modes = ["sync"]
rtt_ms = [10]
gamma = [3]
clients = [1]
requests = 1
max_new_tokens = 8
profile = "toy-edge-cloud"
[backend]
kind = "synthetic"
alpha = 0.7
"""

# (what is wrong, the edit to GOOD, a word the error line must contain)
EXPERIMENT_CASES = [
    ("typo'd key", ("gamma = [3]", "gama = [3]"), "gama"),
    ("typo'd backend key", ("alpha = 0.7", "alhpa = 0.7"), "alhpa"),
    ("missing name", ('name = "bad-input"', ""), "name"),
    ("wrong type", ("gamma = [3]", 'gamma = ["three"]'), "gamma"),
    ("wrong type of a count", ("requests = 1", 'requests = "1"'), "requests"),
    ("negative rtt", ("rtt_ms = [10]", "rtt_ms = [10, -5]"), "rtt_ms"),
    ("gamma 0", ("gamma = [3]", "gamma = [0]"), "gamma"),
    ("clients 0", ("clients = [1]", "clients = [0]"), "clients"),
    ("repeats 0", ("requests = 1", "requests = 1\nrepeats = 0"), "repeats"),
    ("negative retries", ("requests = 1", "requests = 1\nretries = -1"), "retries"),
    ("unknown mode", ('modes = ["sync"]', 'modes = ["turbo"]'), "modes"),
    ("unknown launcher", ('launcher = "netns"', 'launcher = "k8s"'), "launcher"),
    ("unknown profile", ('profile = "toy-edge-cloud"', 'profile = "toy-edge-clod"'), "profile"),
    ("alpha out of range", ("alpha = 0.7", "alpha = 1.5"), "alpha"),
    (
        "bad backend path",
        ('kind = "synthetic"\nalpha = 0.7', 'kind = "hf"\npair_path = "/nonexistent/pair"'),
        "pair_path",
    ),
    ("not TOML", ("requests = 1", "requests = = 1"), "TOML"),
]

ARGUMENT_CASES = [
    ("unknown option", ["sweep", "{file}", "--resum"], "--resum"),
    ("missing experiment file argument", ["sweep"], "experiment"),
    ("experiment file that does not exist", ["sweep", "/nonexistent/x.toml"], "/nonexistent/x.toml"),
    ("unknown command", ["swep", "{file}"], "swep"),
]


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )


def our_namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line for line in listed.splitlines() if line.startswith("dsdbed-")]


def assert_refused_before_start(result, word: str, out: Path, namespaces_before: list[str]) -> None:
    TALLY["bad_inputs_tried"] += 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stdout
    assert len(lines) == 1, result.stderr
    assert "error" in lines[0] and word in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert not out.exists()
    if os.geteuid() == 0:
        assert our_namespaces() == namespaces_before


@pytest.mark.parametrize("what,edit,word", EXPERIMENT_CASES, ids=[c[0] for c in EXPERIMENT_CASES])
def test_a_bad_experiment_file_gets_one_line_naming_the_key_before_anything_starts(tmp_path, what, edit, word):
    old, new = edit
    assert old in GOOD
    path = tmp_path / "experiment.toml"
    path.write_text(GOOD.replace(old, new))
    out = tmp_path / "out"
    before = our_namespaces() if os.geteuid() == 0 else []
    assert_refused_before_start(run_cli(["sweep", str(path), "--out", str(out)]), word, out, before)


@pytest.mark.parametrize("what,args,word", ARGUMENT_CASES, ids=[c[0] for c in ARGUMENT_CASES])
def test_a_bad_cli_argument_gets_one_line_naming_it(tmp_path, what, args, word):
    path = tmp_path / "experiment.toml"
    path.write_text(GOOD)
    out = tmp_path / "out"
    args = [a.replace("{file}", str(path)) for a in args] + ["--out", str(out)] * ("sweep" in args)
    before = our_namespaces() if os.geteuid() == 0 else []
    assert_refused_before_start(run_cli(args), word, out, before)


def test_the_good_file_passes_the_same_checks(tmp_path):
    """The table's base file is valid: each case fails for its own edit, not for the base."""
    path = tmp_path / "experiment.toml"
    path.write_text(GOOD)
    result = run_cli(["sweep", str(path), "--out", str(tmp_path / "out"), "--dry-run"])
    assert result.returncode == 0, result.stderr
    assert "sync_rtt10ms_g3_c1_r0" in result.stdout


@pytest.mark.parametrize(
    "edit, word",
    [
        (("clients = [1]", "clients = [1, 5000]"), "clients"),
        (("clients = [1]", 'clients = [1, 2]\ncontroller = "heuristic"'), "controller"),
    ],
    ids=["more clients than the sim holds", "an adaptive controller with several clients"],
)
def test_what_the_sim_launcher_cannot_run_with_several_clients_is_refused_before_anything_starts(tmp_path, edit, word):
    """The sim runs up to MAX_CLIENTS clients on one verifier, with a static plan (its shared
    verifier takes no hand-over): past either, the whole sweep is refused in one line naming the
    key, before the first point."""
    path = tmp_path / "experiment.toml"
    path.write_text(GOOD.replace(*edit))
    out = tmp_path / "out"
    before = our_namespaces() if os.geteuid() == 0 else []
    assert_refused_before_start(
        run_cli(["sweep", str(path), "--out", str(out), "--launcher", "sim"]), word, out, before
    )
