"""Trace CSVs cut short by a killed writer: whole rows kept, the partial one dropped and counted."""

import csv
import io

from orchestrator.common.csv_rows import read_whole_rows, whole_rows


def trace(n_rows: int) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["run_id", "round_index", "error"])
    for i in range(n_rows):
        writer.writerow(["r1", i, "line one\nline two" if i == 1 else ""])
    return out.getvalue()


def test_a_whole_trace_is_kept_as_it_is():
    text = trace(4)
    assert whole_rows(text) == (text, 0)
    frame, dropped = read_whole_rows(text.encode())
    assert list(frame["round_index"]) == [0, 1, 2, 3] and dropped == 0
    assert frame["error"].iloc[1] == "line one\nline two"  # a quoted newline is not a cut


def test_a_last_line_cut_anywhere_is_dropped_and_counted():
    text = trace(4)
    last_start = text.rstrip("\r\n").rfind("\n") + 1
    for cut in range(last_start + 1, len(text) - 1):  # every cut inside the last row
        frame, dropped = read_whole_rows(text[:cut])
        assert list(frame["round_index"]) == [0, 1, 2] and dropped == 1, repr(text[last_start:cut])


def test_a_row_with_too_few_fields_is_dropped_and_an_empty_or_header_only_file_is_empty():
    frame, dropped = read_whole_rows("a,b,c\n1,2,3\n4,5\n6,7,8\n")
    assert frame.values.tolist() == [[1, 2, 3], [6, 7, 8]] and dropped == 1
    assert read_whole_rows(b"")[0].empty and read_whole_rows(b"a,b")[1] == 1
