"""The orchestrator: experiment files, sweeps over the testbed, analysis, plots, the CLI."""
