"""Read trace CSVs that a killed writer may have cut short: whole rows only, and a count of what
was dropped.

The edges write their traces live, one flushed row per round, so an edge killed mid-write leaves
a last line without its line end (or a row with too few fields). Such rows are detected and
dropped here; the caller records how many, so a loss is never silent.
"""

from __future__ import annotations

import csv
import io

import pandas as pd


def whole_rows(text: str) -> tuple[str, int]:
    """(the text cut back to whole rows, rows dropped). A row is whole when it ends with a line
    end and has as many fields as the header."""
    dropped = 0
    if text and not text.endswith("\n"):
        cut = text.rfind("\n")
        text, dropped = (text[: cut + 1] if cut >= 0 else ""), 1
    if not text.strip():
        return "", dropped
    records = list(csv.reader(io.StringIO(text, newline="")))
    header, rows = records[0], records[1:]
    kept = [row for row in rows if len(row) == len(header)]
    dropped += len(rows) - len(kept)
    if len(kept) == len(rows):
        return text, dropped
    out = io.StringIO()
    csv.writer(out).writerows([header, *kept])
    return out.getvalue(), dropped


def read_whole_rows(data: bytes | str) -> tuple[pd.DataFrame, int]:
    """A DataFrame of the whole rows of a CSV (empty if none) and the number of rows dropped."""
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    text, dropped = whole_rows(text)
    frame = pd.read_csv(io.StringIO(text)) if text.strip() else pd.DataFrame()
    return frame, dropped
