"""The kernel backend's plan and the iptables plan, as data (this kernel cannot apply netem)."""

from __future__ import annotations

import pytest

from netem import kernel
from netem.endpoints import Endpoint, Link
from netem.plan import NETEM_HANDLE, RATE_CLASS, RATE_ROOT, KernelPlanError, TcRequest, plan_link, pyroute2_units
from netem.rules import QueueRule, plan_rules
from netem.spec import DirectionSpec, LinkSpec

BR = "/run/netns/dsdbed-t-br"


def make_link(spec: LinkSpec) -> Link:
    edge = Endpoint("edge0", "/run/netns/dsdbed-t-e0", "dsdbeth0", "198.18.0.2", "dsdbp0", BR)
    verifier = Endpoint("verifier", "/run/netns/dsdbed-t-v", "dsdbeth0", "198.18.0.1", "dsdbpv", BR)
    return Link("edge0", edge, verifier, spec)


def test_pyroute2_units_are_integer_microseconds_percent_and_bytes_per_second():
    netem, rate = pyroute2_units(
        DirectionSpec(delay_ms=12.5, jitter_ms=0.75, loss_pct=1.5, rate_mbit=10, correlation_pct=25), limit_pkts=3000
    )
    assert netem == {"delay": 12500, "jitter": 750, "loss": 1.5, "limit": 3000, "delay_corr": 25, "loss_corr": 25}
    assert isinstance(netem["delay"], int) and isinstance(netem["jitter"], int)
    assert rate == {"rate": 1_250_000, "ceil": 1_250_000}


def test_plan_without_rate_is_one_root_netem_per_direction():
    plan = plan_link(make_link(LinkSpec(rtt_ms=20, jitter_ms=1, loss_pct=2)), max_pps=10_000)
    # limit: backlog 1000 + 10 kpps x (10 ms + 3 x 1/sqrt(3) ms of jitter) x 1.25 headroom.
    netem = {"delay": 10000, "jitter": 1000, "loss": 2, "limit": 1000 + 147}
    assert plan == [
        TcRequest("replace", "netem", "/run/netns/dsdbed-t-e0", "dsdbeth0", NETEM_HANDLE, None, netem),
        TcRequest("replace", "netem", BR, "dsdbp0", NETEM_HANDLE, None, netem),
    ]


def test_plan_with_rate_puts_netem_below_an_htb_class_on_both_sides():
    plan = plan_link(make_link(LinkSpec(delay_up_ms=5, delay_down_ms=15, rate_mbit=8)), max_pps=10_000)
    where = [(r.netns, r.ifname) for r in plan]
    assert where == [("/run/netns/dsdbed-t-e0", "dsdbeth0")] * 3 + [(BR, "dsdbp0")] * 3
    up = plan[:3]
    assert [(r.command, r.kind, r.handle, r.parent) for r in up] == [
        ("replace", "htb", RATE_ROOT, None),
        ("replace-class", "htb", RATE_CLASS, RATE_ROOT),
        ("replace", "netem", NETEM_HANDLE, RATE_CLASS),
    ]
    assert up[0].attrs == {"default": 1}
    assert up[1].attrs == {"rate": 1_000_000, "ceil": 1_000_000}
    assert up[2].attrs["delay"] == 5000 and plan[5].attrs["delay"] == 15000
    assert RATE_ROOT >> 16 == 0xD5DB and NETEM_HANDLE >> 16 == 0xD5DC  # our qdisc "prefix"


def test_kernel_plan_refuses_a_distribution_netem_cannot_get_through_pyroute2():
    with pytest.raises(KernelPlanError, match="distribution"):
        plan_link(make_link(LinkSpec(rtt_ms=20, jitter_ms=2, distribution="normal")), max_pps=1000)


def _observed_as_planned(plan):
    return [
        {
            "command": r.command,
            "kind": r.kind,
            "handle": r.handle,
            "parent": r.parent,
            "options": kernel.expected_options(r),
        }
        for r in plan
    ]


def test_read_back_comparison_accepts_the_planned_state_and_names_a_difference():
    plan = plan_link(make_link(LinkSpec(rtt_ms=20, jitter_ms=1, loss_pct=2, rate_mbit=8)), max_pps=1000)[:3]
    observed = _observed_as_planned(plan)
    assert kernel.compare(plan, observed) == []
    observed[2]["options"]["delay"] *= 2
    del observed[1]
    problems = kernel.compare(plan, observed)
    assert len(problems) == 2
    assert any(p.startswith("missing: tc replace-class htb") for p in problems)
    assert any("delay is" in p for p in problems)


def test_expected_netem_options_are_in_the_kernels_units():
    request = plan_link(make_link(LinkSpec(rtt_ms=20)), max_pps=1000)[0]
    expected = kernel.expected_options(request)
    # netem reports delay in scheduler ticks and loss as a share of 2^32 - 1.
    assert expected["delay"] > 0 and expected["loss"] == 0 and expected["limit"] == request.attrs["limit"]


def test_iptables_plan_is_one_physdev_rule_per_direction_without_queue_bypass():
    plan = plan_rules(
        BR, "DSDBED-t", "FORWARD", [QueueRule("dsdbp0", "dsdbpv", 1000), QueueRule("dsdbpv", "dsdbp0", 1001)]
    )
    assert plan.rule_specs() == [
        "-A DSDBED-t -m physdev --physdev-in dsdbp0 --physdev-out dsdbpv -j NFQUEUE --queue-num 1000",
        "-A DSDBED-t -m physdev --physdev-in dsdbpv --physdev-out dsdbp0 -j NFQUEUE --queue-num 1001",
    ]
    assert plan.restore_text().splitlines()[:2] == ["*filter", ":DSDBED-t - [0:0]"]
    assert "bypass" not in plan.restore_text()
    assert plan.jump_spec == ["FORWARD", "-j", "DSDBED-t"]


def test_a_schedule_step_on_the_kernel_path_replaces_the_same_qdiscs_in_place():
    """netem's change keeps its queue: a step must be a "replace" of the handles already there."""
    from netem.schedule import LinkSchedule

    base = LinkSpec(rtt_ms=20, jitter_ms=2, rate_mbit=10)
    ((_, stepped),) = LinkSchedule.from_steps([{"at_s": 5, "rtt_ms": 150, "loss_pct": 1}]).specs(base)
    before, after = plan_link(make_link(base), max_pps=1000), plan_link(make_link(stepped), max_pps=1000)
    assert [(r.command, r.kind, r.ifname, r.handle, r.parent) for r in before] == [
        (r.command, r.kind, r.ifname, r.handle, r.parent) for r in after
    ]
    netem = [r for r in after if r.kind == "netem"]
    assert {r.attrs["delay"] for r in netem} == {75_000} and {r.attrs["loss"] for r in netem} == {1}
