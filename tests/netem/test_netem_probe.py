"""The backend probe: it agrees with a direct attempt and leaves nothing behind."""

from __future__ import annotations

import pytest
from pyroute2 import netns as pyroute2_netns
from pyroute2.netlink.exceptions import NetlinkError

from netem import names, nsutil, probe
from netem.endpoints import ifindex, open_iproute
from netem.topology import remove_netns

pytestmark = pytest.mark.root


def netem_works_directly() -> bool:
    name = names.netns_name(names.new_tag(), "direct")
    pyroute2_netns.create(name)
    try:
        with open_iproute(nsutil.netns_path(name)) as ipr:
            ipr.link("add", ifname="dsdbd0", kind="veth", peer="dsdbd1")
            try:
                ipr.tc("add", "netem", ifindex(ipr, "dsdbd0"), 0x10000, delay=1000)
            except NetlinkError as exc:
                assert exc.code == 2, "a missing sch_netem shows as ENOENT"
                return False
        return True
    finally:
        remove_netns(name)


def test_probe_agrees_with_a_direct_netem_attempt_and_leaves_no_namespace():
    result = probe.probe_backends.__wrapped__()  # not the cached answer
    assert result.kernel_netem == netem_works_directly()
    assert not [n for n in pyroute2_netns.listnetns() if n.startswith(names.PREFIX)]
    print(f"probe: {result}")


def test_auto_prefers_kernel_netem_and_falls_back_to_nfqueue():
    result = probe.probe_backends()
    backend, reason = probe.choose_backend("auto")
    assert backend == (probe.KERNEL_NETEM if result.kernel_netem else probe.NFQUEUE)
    if result.nfqueue:
        assert probe.choose_backend("auto", "a normal distribution")[0] == probe.NFQUEUE


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="'netem'"):
        probe.choose_backend("netem")


def test_requesting_a_missing_backend_is_an_error_not_a_fallback():
    result = probe.probe_backends()
    for backend, available in ((probe.KERNEL_NETEM, result.kernel_netem), (probe.NFQUEUE, result.nfqueue)):
        if available:
            assert probe.choose_backend(backend) == (backend, "requested")
        else:
            with pytest.raises(RuntimeError, match="unavailable"):
                probe.choose_backend(backend)
