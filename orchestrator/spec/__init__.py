"""The experiment spec: the experiment file, its [sampling], [workload], [load]/[slo] and
[external] tables, and the plan of points."""
