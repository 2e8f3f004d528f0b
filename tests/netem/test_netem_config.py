"""Config dataclasses and names: a bad value is a ValueError naming the field and the value."""

from __future__ import annotations

import pytest

from netem import names
from netem.shaper import ShaperConfig
from netem.topology import TopologyConfig, plan_topology
from tests.checks import every


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"backend": "tc"}, "backend"),
        ({"max_pps": 0}, "max_pps"),
        ({"queue_base": 70_000}, "queue_base"),
        ({"rt_priority": 100}, "rt_priority"),
        ({"verify_interval_s": 0}, "verify_interval_s"),
        ({"tag": "Bad-Tag"}, "tag"),
    ],
)
def test_shaper_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ShaperConfig(**kwargs)


def test_misspelt_option_is_an_error():
    with pytest.raises(TypeError, match="max_ppps"):
        ShaperConfig(max_ppps=10)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n_edges": 0}, "n_edges"),
        ({"n_edges": 2, "subnet": "10.0.0.0/30"}, "subnet"),
        ({"n_edges": 2, "subnet": "nonsense"}, "subnet"),
    ],
)
def test_topology_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TopologyConfig(**kwargs)


def test_topology_plan_names_everything_with_our_prefix():
    plan = plan_topology(TopologyConfig(n_edges=64, tag="abc123"))
    assert plan.all_netns[:3] == ["dsdbed-abc123-br", "dsdbed-abc123-v", "dsdbed-abc123-e0"]
    assert every(n.startswith("dsdbed-") for n in plan.all_netns)
    ports = [plan.verifier.bridge_port] + [e.bridge_port for e in plan.edges]
    assert every(p.startswith("dsdb") and len(p) <= 15 for p in ports)
    assert plan.verifier.ip == "198.18.0.1" and plan.edges[63].ip == "198.18.0.65"


def test_interface_names_must_carry_the_prefix_and_fit_the_kernel():
    assert names.check_ifname("dsdbp12") == "dsdbp12"
    for bad in ("eth0", "dsdb-much-too-long-name"):
        with pytest.raises(ValueError, match=repr(bad)):
            names.check_ifname(bad)
