"""Assertions the tests share."""


def every(checks) -> bool:
    """all(checks), and at least one check: a claim about every item of an empty list says nothing."""
    checks = list(checks)
    return bool(checks) and all(checks)
