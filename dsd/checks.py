"""Argument checks shared by every config dataclass of the testbed (dsd's, the services' and the
orchestrator's experiment keys): what counts as a whole number and as a number, and the one
shape of the error, which names the key and the value it got."""

from __future__ import annotations

import math
from typing import NoReturn, TypeGuard


def is_int(value: object) -> TypeGuard[int]:
    """A whole number (an int, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fail(key: str, value: object, expected: str, where: str = "experiment key") -> NoReturn:
    """Raise the ValueError that names the key, what it expects and what it got."""
    raise ValueError(f"{where} {key!r}: expected {expected}, got {value!r}")


def check(ok: bool, key: str, value: object, expected: str, where: str = "experiment key") -> None:
    """``fail`` unless ``ok``."""
    if not ok:
        fail(key, value, expected, where)
