"""Files the orchestrator writes: whole or not at all, and JSON by one rule.

Whole or not at all: written beside, then renamed, so a crash never leaves a half-written file
under the real name. JSON (docs/outputs.md): tuples become lists, numpy scalars plain numbers,
keys text, and whatever else JSON has no type for its text; a non-finite float stays what it is,
written ``NaN``, ``Infinity`` or ``-Infinity`` (Python's json and pandas read them back). A
crossover at -Infinity says "never wins" and one at Infinity "wins over the whole grid", which a
null could not.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def write_atomic(path: Path, text: str) -> None:
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def jsonable(value):
    """``value`` as plain JSON data, by the rule above."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)


def to_json(value, indent: int | None = 2) -> str:
    return json.dumps(jsonable(value), indent=indent)


def write_json(path: Path, value, indent: int | None = 2) -> None:
    """``value`` as JSON (the rule above), written whole."""
    write_atomic(path, to_json(value, indent))
