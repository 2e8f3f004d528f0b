"""An acceptance trace on every launcher: the services replay it, not i.i.d. alpha.

On a network launcher the trace reaches the edges and the verifier inline (a container cannot
read the host's file); the check is exact: each request's accepted counts are the trace's
rounds from where its prompt starts, one for one.
"""

import json
import os

import pandas as pd
import pytest

from dsd.backends.acceptance_trace import AcceptanceTrace
from dsd.backends.factory import backend_from_json
from orchestrator.cli import main
from orchestrator.spec.experiment import experiment_from_dict, load_experiment
from orchestrator.launchers.compose import ComposeConfig
from orchestrator.launchers.processes import backend_args
from orchestrator.report.html import write_report
from orchestrator.report.analyze import analyze_sweep
from orchestrator.running.run import run_experiment
from orchestrator.records.sweep_folder import experiment_record
from orchestrator.spec.workload import make_prompts
from tests.acceptance_traces import bimodal_trace, histogram, total_variation, write_rounds

REPO_TRACE = "experiments/traces/default-pair-rounds.csv"


def trace_file(tmp_path, trace: AcceptanceTrace):
    rows = [("p", 0, 0, i, g, a, False, "") for i, (g, a) in enumerate(trace.rounds)]
    return write_rounds(tmp_path / "trace.csv", rows)


def experiment(tmp_path, trace, **keys):
    return experiment_from_dict(
        {
            "name": "tr",
            "modes": ["sync"],
            "rtt_ms": [0],
            "gamma": [4],
            "clients": [1],
            "edges": 1,
            "requests": 6,
            "warmup_requests": 1,
            "max_new_tokens": 40,
            "prompt_tokens": 8,
            "profile": "toy-edge-cloud",
            **keys,
            "backend": {"kind": "synthetic", "seed": 5, "acceptance_trace": str(trace_file(tmp_path, trace))},
        }
    )


def check_exact_replay(exp, out, trace):
    rounds = pd.read_csv(out / "rounds.csv")
    rounds = rounds[(rounds["proposed"] > 0) & ~rounds["stale"].astype(bool)]
    prompts = make_prompts(exp.backend, exp.warmup_requests + exp.requests, exp.prompt_tokens, exp.seed)
    assert set(rounds["request_index"]) == set(range(exp.requests))
    for index, group in rounds.groupby("request_index"):
        start = trace.start_index(exp.backend.seed, prompts[exp.warmup_requests + index])
        first = trace.round_starts.index(start)
        accepted = list(group.sort_values("round_index")["accepted"])
        assert accepted == [trace.rounds[(first + i) % len(trace.rounds)][1] for i in range(len(accepted))], index


def test_a_sim_sweep_replays_the_trace_and_reproduces_its_histogram(tmp_path):
    trace = bimodal_trace(n_rounds=300)
    exp = experiment(tmp_path, trace, launcher="sim", requests=120, max_new_tokens=48)
    run_experiment(exp, tmp_path / "sim", resume=False)
    check_exact_replay(exp, tmp_path / "sim", trace)
    rounds = pd.read_csv(tmp_path / "sim" / "rounds.csv")
    want = {a: c / len(trace.rounds) for a, c in trace.histogram().items()}
    assert total_variation(histogram(list(rounds["accepted"])), want) < 0.06
    recorded = json.loads((tmp_path / "sim" / "sweep.json").read_text())["acceptance_trace"]
    assert recorded["rounds"] == 300 and recorded["alpha_measured"] == pytest.approx(trace.alpha_measured)
    analyze_sweep(tmp_path / "sim")
    assert "acceptance replayed from the trace" in write_report(tmp_path / "sim").read_text()


def test_the_loopback_services_replay_the_trace_sent_inline(tmp_path):
    trace = bimodal_trace()
    exp = experiment(tmp_path, trace, launcher="loopback", modes=["sync", "pipelined", "colocated"])
    run_experiment(exp, tmp_path / "lo", resume=False)
    for mode in ("sync", "colocated"):  # pipelined: stale blocks interleave, checked below
        frame = pd.read_csv(tmp_path / "lo" / "rounds.csv")
        sub = tmp_path / mode
        sub.mkdir()
        frame[frame["mode"] == mode].to_csv(sub / "rounds.csv", index=False)
        check_exact_replay(exp, sub, trace)
    run_jsons = list((tmp_path / "lo" / "services").rglob("run.json"))
    assert run_jsons  # each edge run says what it replayed
    for run_json in run_jsons:
        assert json.loads(run_json.read_text())["backend"]["acceptance_trace"]["rounds"] == len(trace.rounds)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_the_netns_services_replay_the_trace_sent_inline(tmp_path):
    trace = bimodal_trace()
    exp = experiment(tmp_path, trace, launcher="netns", rtt_ms=[10])
    run_experiment(exp, tmp_path / "ns", resume=False)
    check_exact_replay(exp, tmp_path / "ns", trace)


def test_services_and_containers_get_the_rounds_not_the_path(tmp_path):
    trace = bimodal_trace(n_rounds=50)
    exp = experiment(tmp_path, trace)
    args = backend_args(exp.backend, None)
    sent = backend_from_json(args[args.index("--backend-json") + 1])
    assert sent.acceptance_rounds == trace.to_text() and sent.trace().rounds == trace.rounds
    assert str(tmp_path) not in " ".join(args)
    env = ComposeConfig(n_edges=1, backend=exp.backend, profile=exp.hardware_profile("toy-edge-cloud")).compose_env()
    assert backend_from_json(env["DSD_BACKEND_JSON"]) == sent


def test_experiment_keys_a_relative_trace_and_no_alpha_sweep(tmp_path):
    trace_file(tmp_path, bimodal_trace(n_rounds=20))
    (tmp_path / "e.toml").write_text(
        'name = "e"\nprofile = "toy-edge-cloud"\n[backend]\nkind = "synthetic"\nacceptance_trace = "trace.csv"\n'
    )
    loaded = load_experiment(tmp_path / "e.toml")
    assert loaded.backend.trace().rounds == bimodal_trace(n_rounds=20).rounds
    with pytest.raises(ValueError, match="'alpha'.*acceptance_trace"):
        experiment(tmp_path, bimodal_trace(), alpha=[0.5, 0.7])
    with pytest.raises(ValueError, match="acceptance_trace"):
        experiment_from_dict(
            {
                "name": "x",
                "profile": "toy-edge-cloud",
                "backend": {"kind": "synthetic", "acceptance_trace": str(tmp_path / "none.csv")},
            }
        )
    plain = experiment_record(experiment_from_dict({"name": "x", "profile": "toy-edge-cloud"}))
    assert "acceptance_trace" not in plain["backend"]  # older sweep folders still resume


def test_the_shipped_trace_and_experiment_are_valid(capsys):
    assert main(["sweep", "experiments/acceptance-trace.toml", "--dry-run"]) == 0
    exp = load_experiment("experiments/acceptance-trace.toml")
    trace = exp.backend.trace()
    assert len(trace.rounds) >= 200 and 0.3 < trace.alpha_measured < 0.95 and {g for g, _ in trace.rounds} == {4}
    assert os.path.samefile(exp.backend.acceptance_trace, REPO_TRACE)
