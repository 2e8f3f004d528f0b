"""What a reader needs to trust a sweep's numbers, as sweep.json records it: versions, the git
commit, the machine."""

from __future__ import annotations

import os
import platform
import sys
import time

from dsd.backends.machine import CpuCapability
from dsd.provenance import git_commit, git_dirty


def host_facts() -> dict:
    import torch
    import transformers

    cpu = CpuCapability.of_this_machine()
    return {
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpu": cpu.describe(),
        "cpu_capability": cpu.to_dict(),
        "cpus": os.cpu_count(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
