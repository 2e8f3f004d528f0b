import os

import pytest


@pytest.fixture(autouse=True)
def nothing_left_after_a_fault_test(request):
    """Every fault test ends with zero leftovers (namespaces, rules, qdiscs, daemons, services,
    containers, networks); counted for the closing figures, and a failure if any."""
    if "root" not in request.keywords or os.geteuid() != 0:
        yield
        return
    from orchestrator.launchers import leftovers
    from tests.faults.faults import BASELINE, TALLY

    # What was there before (a compose project someone brought up by hand) is not the test's.
    BASELINE[:] = leftovers.find()
    yield
    found = [item for item in leftovers.find() if item not in BASELINE]
    TALLY["fault_tests"] += 1
    TALLY["leftovers_after"] += len(found)
    if found:
        pytest.fail(f"leftovers after the test: {found}; `dsdbed cleanup` removes them")


def pytest_terminal_summary(terminalreporter):
    from tests.faults.faults import TALLY

    if TALLY["fault_tests"] or TALLY["bad_inputs_tried"]:
        terminalreporter.write_line("fault tally: " + " ".join(f"{k}={v}" for k, v in TALLY.items()))
