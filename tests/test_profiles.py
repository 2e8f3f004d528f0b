import pytest

from dsd.profiles import get_profile, load_profiles


def test_shipped_profiles_load_and_every_number_names_its_source():
    profiles = load_profiles()
    assert {"toy-edge-cloud", "cpu2-default-pair"} <= set(profiles)
    for profile in profiles.values():
        sourced = dict(profile.sources)
        assert all(sourced[k] for k in sourced)


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
