"""Open-loop serving sweeps ([load]): the arrival-driven runs, their virtual-time model,
prediction, figures and report."""
