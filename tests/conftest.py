import os
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Choices kept per machine (dtype "auto", kernel paths) go to a folder of the test session's own,
# shared with the services it starts, never to the user's cache.
os.environ.setdefault("DSD_CACHE_DIR", tempfile.mkdtemp(prefix="dsd-test-cache-"))

import torch  # noqa: E402

# Tests run many tiny tensor ops; torch's intra-op thread pool only adds wake-up latency to
# them, and on a shared 2-core machine it can add milliseconds per op.
torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """A test marked root is skipped, not failed, where the suite does not run as root (CI runs as
    root): network namespaces, iptables, tc, and starting a Docker engine need it."""
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (network namespaces, iptables, tc, starting dockerd)")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)
