"""netem: shape each edge<->verifier link (delay, jitter, loss, rate), check it, measure it, undo it.

What the orchestrator calls::

    from netem import LinkSpec, Shaper, ShaperConfig, Topology, TopologyConfig, cleanup_leftovers

    with Topology(TopologyConfig(n_edges=4)) as topo:           # or endpoints from containers
        links = topo.links([LinkSpec(rtt_ms=20 * (i + 1), jitter_ms=1) for i in range(4)])
        with Shaper(ShaperConfig()) as shaper:
            records = shaper.apply(links)     # -> list[LinkRecord]
            # record.backend is "kernel-netem" or "nfqueue"; record.measured holds the configured
            # vs measured RTT (p50, p99, stdev, loss); record.as_row() is a flat dict for traces.
            ...                               # run the experiment; shaper.check() raises if
                                              # shaping died (a dead NFQUEUE daemon drops packets)
    cleanup_leftovers()                       # after a crash: removes everything named dsdbed*

- `LinkSpec` (spec.py): one link; rtt_ms is split half each way (or delay_up_ms/delay_down_ms);
  jitter, loss and rate apply to each direction.
- `Link`, `Endpoint` (endpoints.py): an edge and the verifier, each an interface in a network
  namespace plugged into a bridge; `endpoint_from_netns`, `endpoint_from_container` (Docker).
- `Shaper` (shaper.py): probes the backend (probe.py), then either applies a tc plan through
  pyroute2 (plan.py, kernel.py) or runs the NFQUEUE daemon (nfqueue_daemon.py, daemon.py, model.py)
  fed by iptables rules on the bridge's FORWARD path (rules.py); reads back; measures (measure.py).
- `Topology` (topology.py): N edge namespaces + a verifier namespace on a bridge, for tests,
  benchmarks and services; `nsutil.in_netns(endpoint.netns, argv)` is the argv that starts a
  service inside an endpoint (stop it before the topology closes: leftovers get killed).
- `LinkSchedule` (schedule.py): steps or a replayed trace; `state_at(base, t_s)` is the link in
  force; `shaper.schedule([(t_monotonic_s, [spec per link]), ...])` applies changes while running.
- `cleanup_leftovers()` (cleanup.py): idempotent removal of leftovers by prefix.
"""

import importlib

# Exported lazily: the NFQUEUE daemon imports `netem.nfqueue_daemon`, and a package __init__ that
# imported everything would load pyroute2 and the rest into it for nothing (~0.3 s, more memory).
_EXPORTS = {
    "cleanup_leftovers": "netem.cleanup",
    "Endpoint": "netem.endpoints",
    "Link": "netem.endpoints",
    "endpoint_from_container": "netem.endpoints",
    "endpoint_from_netns": "netem.endpoints",
    "LinkMeasurement": "netem.measure",
    "KERNEL_NETEM": "netem.probe",
    "NFQUEUE": "netem.probe",
    "ProbeResult": "netem.probe",
    "probe_backends": "netem.probe",
    "LinkRecord": "netem.shaper",
    "Shaper": "netem.shaper",
    "ShaperConfig": "netem.shaper",
    "ShaperFailed": "netem.shaper",
    "DirectionSpec": "netem.spec",
    "LinkSpec": "netem.spec",
    "LinkSchedule": "netem.schedule",
    "Topology": "netem.topology",
    "TopologyConfig": "netem.topology",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'netem' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
