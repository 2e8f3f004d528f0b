"""CPU isolation and contention made visible (orchestrator/common/cpus.py)."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from orchestrator.common import cpus
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.report.analyze import analyze_sweep
from orchestrator.running.run import run_experiment
from tests.checks import every


def test_with_four_or_more_cpus_every_role_gets_a_disjoint_set():
    plan = cpus.plan_cpus(list(range(8)), n_edges=3)
    assert plan["pinned"] and plan["disjoint"]
    sets = plan["sets"]
    roles = [set(sets["orchestrator"]), set(sets["shaper"]), set(sets["verifier"]), set(sets["edge0"])]
    assert every(roles) and sum(len(r) for r in roles) == len(set().union(*roles)) == 8
    assert sets["edge0"] == sets["edge2"]
    assert cpus.plan_cpus([0, 1, 2, 3], 1)["sets"]["verifier"] == [2]


def test_on_two_cpus_auto_pins_nothing_and_says_why_and_on_shares_honestly():
    auto = cpus.plan_cpus([0, 1], n_edges=1)
    assert not auto["pinned"] and "only 2 CPU" in auto["reason"] and auto["sets"] == {}
    forced = cpus.plan_cpus([0, 1], n_edges=1, mode="on")
    assert forced["pinned"] and not forced["disjoint"]
    assert forced["sets"]["verifier"] == [1] and forced["sets"]["edge0"] == forced["sets"]["orchestrator"] == [0]
    assert not cpus.plan_cpus(list(range(8)), 1, mode="off")["pinned"]
    with pytest.raises(ValueError, match="cpu_pinning"):
        cpus.plan_cpus([0, 1], 1, mode="always")
    with pytest.raises(ValueError, match="cpu_pinning"):
        experiment_from_dict(
            {"name": "x", "cpu_pinning": "yes", "profile": "toy-edge-cloud", "backend": {"kind": "synthetic"}}
        )


def test_pin_sets_every_thread_of_a_running_process_and_reads_it_back():
    code = "import threading, time; [threading.Thread(target=time.sleep, args=(20,)).start() for _ in range(3)]; time.sleep(20)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        first = sorted(os.sched_getaffinity(0))[:1]
        import time

        time.sleep(0.3)  # let the threads start
        assert cpus.pin(proc.pid, first) == first
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert len(tids) >= 4 and all(sorted(os.sched_getaffinity(t)) == first for t in tids)
    finally:
        proc.kill()
        proc.wait()


def test_contention_is_flagged_by_load_above_the_cpu_count_or_steal():
    before = cpus.CpuSample(0.0, busy=100, total=1000, steal=0, load_1m=0.5)
    calm = cpus.conditions(before, cpus.CpuSample(1.0, 400, 2000, 5, 1.0), n_cpus=2)
    assert not calm["contended"] and calm["cpu_busy_pct"] == pytest.approx(30.0)
    assert calm["cpu_steal_pct"] == pytest.approx(0.5)
    assert cpus.conditions(before, cpus.CpuSample(1.0, 400, 2000, 5, 3.5), n_cpus=2)["contended"]
    assert cpus.conditions(before, cpus.CpuSample(1.0, 400, 2000, 50, 1.0), n_cpus=2)["contended"]
    sample = cpus.CpuSample.now()
    assert sample.total > sample.busy >= 0


def test_loopback_sweep_records_the_pinning_and_each_points_conditions(tmp_path):
    """cpu_pinning = on (this machine may have 2 CPUs): sweep.json holds the plan, each point's
    done.json the masks read back from the running services and the machine's load; points.csv
    and the report carry them."""
    experiment = experiment_from_dict(
        {
            "name": "pin",
            "launcher": "loopback",
            "modes": ["sync"],
            "rtt_ms": [0, 5],
            "gamma": [3],
            "edges": 1,
            "requests": 2,
            "warmup_requests": 0,
            "max_new_tokens": 16,
            "prompt_tokens": 8,
            "cpu_pinning": "on",
            "profile": "toy-edge-cloud",
            "backend": {"kind": "synthetic", "alpha": 0.7},
        }
    )
    out = tmp_path / "pin"
    before = os.sched_getaffinity(0)
    run_experiment(experiment, out, resume=False)
    assert os.sched_getaffinity(0) == before  # the orchestrator's own pinning ends with the sweep
    sweep = json.loads((out / "sweep.json").read_text())
    plan = sweep["cpu_pinning"]
    if len(before) < 2:
        pytest.skip("one CPU: nothing to pin")
    assert plan["pinned"] and plan["sets"]["verifier"]
    done = json.loads(next((out / "points").glob("*/done.json")).read_text())
    assert done["cpu_masks"]["verifier"] == plan["sets"]["verifier"]
    assert done["cpu_masks"]["edge0"] == plan["sets"]["edge0"]
    assert {"cpu_busy_pct", "cpu_steal_pct", "load_avg_1m", "contended"} <= set(done["cpu"])
    summary = analyze_sweep(out)
    points = pd.read_csv(out / "points.csv")
    assert points["contended"].notna().all() and points["load_avg_1m"].gt(0).all()
    assert summary["cpu"]["pinning"]["sets"] == plan["sets"]
    from orchestrator.report.html import write_report

    assert "CPU isolation and contention" in write_report(out).read_text()
