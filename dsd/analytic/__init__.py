"""The analytic models, as pure functions: the closed-form latency of every mode, the queueing of
many clients on one verifier, and the compute regime a run is in."""
