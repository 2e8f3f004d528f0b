"""The adaptive controller: its interface, the policies that choose each round's gamma and mode,
their settings and running estimates, and a run's controller by name."""
