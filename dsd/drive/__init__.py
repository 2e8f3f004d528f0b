"""Running a request: the edge's and the verifier's state machines, the DSD drive loop that runs the
edge's on any clock through a device and a transport (with its hand-overs), and the server's own
loops of cloud AR and co-located SD."""
