"""Without root: the loopback testbed heals the same way (a killed verifier or edge is restarted
and the point retried), so a night's sweep survives on any machine."""

import os
import signal

import pytest

from dsd.costs.profiles import get_profile
from orchestrator.launchers.loopback import LoopbackTestbed
from orchestrator.launchers.services_config import ServicesConfig
from orchestrator.launchers.leftovers import service_processes
from tests.faults.faults import FaultWhenMidRun, check_sweep, small_experiment, survived, sweep_on


@pytest.mark.parametrize("victim", ["verifier", "edge0"])
def test_a_loopback_service_killed_mid_point_is_restarted_and_the_point_retried(tmp_path, victim):
    experiment = small_experiment()
    config = ServicesConfig(
        experiment.backend, get_profile(experiment.profile), n_edges=1, work_dir=str(tmp_path / "services")
    )
    with LoopbackTestbed(config) as testbed:
        process = next(p for p in testbed._processes if p.name == victim)
        with FaultWhenMidRun(tmp_path / "services", lambda: os.killpg(process.proc.pid, signal.SIGKILL)) as fault:
            sweep_on(testbed, experiment, tmp_path / "out")
        assert fault.fired_at_s and fault.error is None
        (record,) = check_sweep(experiment, tmp_path / "out").values()
        mine = {p.proc.pid for p in testbed._processes}
    assert record["status"] == "ok" and len(record["attempts"]) == 2, record
    assert any(f"restarted {victim}" in h for h in record["attempts"][1]["healed"]), record
    assert not mine & set(service_processes()), "the testbed stopped every process it started"
    survived()
