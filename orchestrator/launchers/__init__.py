"""Launchers bring up a testbed (one verifier, N edges), shape its links and tear it down.

Every launcher returns a ``Testbed`` (base.py) and is used the same way by the sweep:

    with launch(experiment) as testbed:           # verifier + edges up and healthy
        records = testbed.shape(specs)            # one netem.LinkSpec per edge; [] if unshaped
        ...  POST testbed.edges[i].control_url + "/runs" {..., "verifier_url": testbed.verifier_url}
             (with Authorization: Bearer testbed.edges[i].token when it is set)
    # everything the launcher started is gone here

sim       no network: real models and protocol on virtual time (orchestrator/sim_point.py)
loopback  verifier and edges as processes on 127.0.0.1; the link is an application-level delay
netns     the same processes inside network namespaces on a bridge, shaped by netem/ (root)
compose   the containers of compose.yaml, shaped by netem/ on their host-side veths (Docker, root)
swarm     the same services as a Docker Swarm stack; each edge shapes its own link in-container
external  a verifier and edges someone else started (real devices), given as URLs and a token;
          the real link measured, or shaped by each edge from inside its namespace (PUT /link)
"""
