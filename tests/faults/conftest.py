import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(items):
    # A root test without root is skipped here, not failed; CI runs as root.
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (network namespaces, iptables)")
        for item in items:
            if "root" in item.keywords and str(item.path).startswith(HERE):
                item.add_marker(skip)
