"""Hardware profiles given with the experiment: [profiles.NAME] tables and --profiles FILE.

The same rule as dsd/costs/profiles.toml (every number names its source), and the profile must reach
the services, not just the analysis.
"""

import json

import pandas as pd
import pytest

from orchestrator.cli import main
from orchestrator.spec.experiment import experiment_from_dict, load_experiment
from orchestrator.running.run import run_experiment

NUMBERS = {
    "t_draft_edge_s": 0.015,
    "t_draft_server_s": 0.002,
    "t_ar_s": 0.025,
    "t_verify_base_s": 0.025,
    "t_verify_per_position_s": 0.0,
    "t_prefill_per_token_s": 0.0001,
    "batch_slope": 0.1,
}


def sourced(numbers=NUMBERS, **changes):
    table = {**numbers, **{f"{k}_source": f"test: {k} chosen" for k in numbers}}
    table.update(changes)
    return table


def inline(table, name="mine", **keys):
    return {"name": "p", "profile": name, "backend": {"kind": "synthetic"}, "profiles": {name: table}, **keys}


def test_an_inline_profile_with_a_missing_source_is_refused_naming_the_key():
    table = sourced()
    del table["t_ar_s_source"]
    with pytest.raises(ValueError, match=r"no source given for \['profiles\.mine\.t_ar_s_source'\]"):
        experiment_from_dict(inline(table))


def test_an_empty_source_a_stray_source_and_a_missing_number_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"profiles\.mine\.batch_slope_source"):
        experiment_from_dict(inline(sourced(batch_slope_source="  ")))
    with pytest.raises(ValueError, match=r"sources for unknown keys \['t_drafts_s_source'\]"):
        experiment_from_dict(inline(sourced(t_drafts_s_source="typo")))
    table = sourced()
    del table["t_ar_s"]
    with pytest.raises(ValueError, match=r"profile profiles\.mine: missing keys \['t_ar_s'\]"):
        experiment_from_dict(inline(table))
    with pytest.raises(ValueError, match=r"t_ar_s must be > 0"):
        experiment_from_dict(inline(sourced(t_ar_s=0)))


def test_an_inline_profile_may_not_shadow_a_packaged_one():
    with pytest.raises(ValueError, match="'profiles.toy-edge-cloud'.*choose another"):
        experiment_from_dict(inline(sourced(), name="toy-edge-cloud"))


def test_inline_profiles_are_used_by_name_and_swept_beside_packaged_ones():
    experiment = experiment_from_dict(inline(sourced(), profile=["mine", "toy-edge-cloud"]))
    assert experiment.hardware_profile("mine").t_draft_edge_s == 0.015
    assert dict(experiment.hardware_profile("mine").sources)["t_ar_s"] == "test: t_ar_s chosen"
    assert experiment.hardware_profile("toy-edge-cloud").t_ar_s == 0.010


def write_profiles_file(path, name="field"):
    path.write_text(f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in sourced().items()))
    return path


def test_the_profiles_option_adds_a_file_of_profiles(tmp_path, capsys):
    experiment_file = tmp_path / "e.toml"
    experiment_file.write_text(
        'name = "e"\nprofile = "field"\nlauncher = "sim"\nmodes = ["sync"]\n'
        'rtt_ms = [0]\n[backend]\nkind = "synthetic"\n'
    )
    assert main(["sweep", str(experiment_file), "--dry-run"]) == 2
    assert "'profile'" in capsys.readouterr().err  # unknown without the file
    profiles = write_profiles_file(tmp_path / "field.toml")
    assert main(["sweep", str(experiment_file), "--dry-run", "--profiles", str(profiles)]) == 0
    assert load_experiment(experiment_file, profiles).hardware_profile("field").t_ar_s == 0.025
    bad = tmp_path / "bad.toml"
    bad.write_text("[x]\nt_ar_s = 0.01\n")
    assert main(["sweep", str(experiment_file), "--dry-run", "--profiles", str(bad)]) == 2
    assert "--profiles" in capsys.readouterr().err


def test_a_sim_sweep_runs_on_the_inline_profile_and_resumes(tmp_path):
    experiment = experiment_from_dict(
        inline(sourced(), modes=["ar", "sync"], rtt_ms=[0], gamma=[4], requests=2, max_new_tokens=16, prompt_tokens=8)
    )
    run_experiment(experiment, tmp_path / "s", resume=False)
    sweep = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert sweep["costs"]["t_draft_edge_s"] == 0.015 and sweep["costs_source"] == "profile mine"
    recorded = sweep["experiment"]["hardware_profiles"][0]
    assert recorded["name"] == "mine" and ["t_ar_s", "test: t_ar_s chosen"] in recorded["sources"]
    run_experiment(experiment, tmp_path / "s", resume=True)  # the same experiment resumes


def test_an_inline_profile_reaches_the_loopback_services(tmp_path):
    """The edge drafts at the inline profile's 15 ms a step and the verifier charges its 25 ms
    pass: nothing of toy-edge-cloud (4 ms, 10 ms)."""
    experiment = experiment_from_dict(
        inline(
            sourced(),
            launcher="loopback",
            modes=["sync"],
            rtt_ms=[0],
            gamma=[2],
            edges=1,
            requests=2,
            warmup_requests=0,
            max_new_tokens=12,
            prompt_tokens=8,
        )
    )
    run_experiment(experiment, tmp_path / "lo", resume=False)
    rounds = pd.read_csv(tmp_path / "lo" / "rounds.csv")
    draft_s = (rounds["t_draft_end_s"] - rounds["t_draft_start_s"]).median()
    assert 0.9 * 2 * 0.015 < draft_s < 1.5 * 2 * 0.015, draft_s
    assert 0.9 * 0.025 < rounds["server_compute_s"].median() < 1.5 * 0.025
