"""Running: an experiment on its launcher (`dsdbed sweep`), repeats until CI, and measuring a
hardware profile."""
