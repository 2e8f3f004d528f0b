import pytest

from dsd.costs.profiles import get_profile, load_profiles
from tests.checks import every


def test_shipped_profiles_load_and_every_number_names_its_source():
    profiles = load_profiles()
    assert {"toy-edge-cloud", "cpu2-default-pair"} <= set(profiles)
    for profile in profiles.values():
        sourced = dict(profile.sources)
        assert every(sourced[k] for k in sourced)


def test_verify_time_grows_with_gamma_and_batch():
    profile = get_profile("cpu2-default-pair")
    assert profile.t_verify_s(8) > profile.t_verify_s(1)
    assert profile.t_verify_s(4, batch_size=2) > profile.t_verify_s(4)


def test_profile_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text("[x]\nt_draft_edge_s = 0.001\n")
    with pytest.raises(ValueError, match="missing keys"):
        load_profiles(bad)
    with pytest.raises(ValueError, match="unknown hardware profile"):
        get_profile("nope")


FIELD = (
    "orin-135m-a100-llama2-7b",
    "orin-135m-h100-llama2-7b",
    "phone-1b-a100x8-llama2-70b",
    "phone-1b-h100x2-llama3-70b",
)


def test_field_profiles_cite_public_sources_and_a_one_position_pass_costs_an_ar_step():
    profiles = load_profiles()
    for name in FIELD:
        profile = profiles[name]
        for field_name, source in profile.sources:
            assert "[" in source or source.startswith("derived"), (name, field_name)
        assert profile.t_verify_s(0) == pytest.approx(profile.t_ar_s, rel=1e-3), name
        assert profile.t_draft_edge_s > profile.t_draft_server_s, name  # an edge drafts slower
    # H100 verifies the same 7B faster than A100; a 70B target is slower than a 7B one
    assert profiles[FIELD[1]].t_ar_s < profiles[FIELD[0]].t_ar_s < profiles[FIELD[3]].t_ar_s


def test_a_profile_without_a_source_or_with_an_empty_one_is_refused_naming_the_key(tmp_path):
    numbers = {
        "t_draft_edge_s": 0.004,
        "t_draft_server_s": 0.002,
        "t_ar_s": 0.01,
        "t_verify_base_s": 0.01,
        "t_verify_per_position_s": 0.0,
        "t_prefill_per_token_s": 0.0001,
        "batch_slope": 0.1,
    }
    lines = [f'{k} = {v}\n{k}_source = "x"\n' for k, v in numbers.items() if k != "batch_slope"]
    path = tmp_path / "p.toml"
    path.write_text("[edge]\n" + "".join(lines) + "batch_slope = 0.1\n")
    with pytest.raises(ValueError, match=r"no source given for \['edge\.batch_slope_source'\]"):
        load_profiles(path)
    path.write_text("[edge]\n" + "".join(lines) + "batch_slope = 0.1\nbatch_slope_source = ''\n")
    with pytest.raises(ValueError, match=r"edge\.batch_slope_source"):
        load_profiles(path)
