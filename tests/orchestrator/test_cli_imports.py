"""The command line starts without the model libraries: torch and transformers load only in a
command that runs a model (the test suite starts dsdbed in subprocesses many times)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers")


def modules_loaded_by(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(name for name in {HEAVY!r} if name in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_importing_the_command_line_loads_neither_torch_nor_transformers():
    assert modules_loaded_by("import orchestrator.cli") == []


def test_a_network_experiment_is_read_and_planned_without_torch():
    code = (
        "from orchestrator.spec.experiment import load_experiment\n"
        "from orchestrator.spec.plan import plan_points\n"
        "assert plan_points(load_experiment('experiments/regime-map-netns.toml'))"
    )
    assert modules_loaded_by(code) == []


def test_the_probe_sees_torch_when_a_model_module_is_imported():
    assert modules_loaded_by("import dsd.speculation.drafting") == ["torch"]
