"""Compute costs: one type for a model pair's compute times, the hardware profiles (profiles.toml),
and measuring the times on this machine."""
