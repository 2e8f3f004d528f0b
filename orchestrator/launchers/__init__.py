"""Launchers bring up a testbed (one verifier, N edges), shape its links and tear it down.

Every launcher returns a ``Testbed`` (base.py) and is used the same way by the sweep
(orchestrator/running/run.py), one (profile, alpha) group at a time:

    testbed = open_testbed(launcher, group, ...)  # verifier + edges up and healthy
    rows = testbed.run_point(point, prompts, settings)   # rounds, requests, links, facts
    testbed.close()                               # everything the launcher started is gone

The network testbeds run a point through their edges (control_api.ControlApiTestbed,
orchestrator/launchers/control_api.py): shape(specs) sets each edge's link, then a POST to
testbed.edges[i].control_url + "/runs" {..., "verifier_url": testbed.verifier_url} per client
(with Authorization: Bearer testbed.edges[i].token when it is set). The sim testbed runs the
same protocol code in this process on virtual time.

sim       no network: real models and protocol on virtual time, in this process (sim.py)
loopback  verifier and edges as processes on 127.0.0.1; the link is an application-level delay
netns     the same processes inside network namespaces on a bridge, shaped by netem/ (root)
compose   the containers of compose.yaml, shaped by netem/ on their host-side veths (Docker, root)
swarm     the same services as a Docker Swarm stack; each edge shapes its own link in-container
external  a verifier and edges someone else started (real devices), given as URLs and a token;
          the real link measured, or shaped by each edge from inside its namespace (PUT /link)
"""
