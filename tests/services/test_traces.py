"""The trace rows: keywords only, and the one steady-state definition every launcher uses."""
import pytest

from services.traces import REQUEST_COLUMNS, RequestRow, RoundRow, as_dict, steady_per_token_s


def test_steady_per_token_time_is_the_time_after_the_first_emission_over_the_tokens_after_it():
    assert steady_per_token_s(0.5, 1.5, 4) == pytest.approx(0.25)
    assert steady_per_token_s(0.5, 0.5, 0) is None        # everything came in the first emission
    assert steady_per_token_s(None, None, 3) is None      # nothing was emitted


def test_rows_are_built_with_keywords_only_and_leave_unmeasured_columns_empty():
    with pytest.raises(TypeError):
        RoundRow("run", "0", "sync", 4, 0, 0, 4, 2, 3, False)
    row = RequestRow(run_id="run", client_id="0", mode="ar", gamma=4, request_index=0, prompt_tokens=8, tokens=3,
                     rounds=3, stale_rounds=0, token_ids="1 2 3")
    values = as_dict(row)
    assert tuple(values) == REQUEST_COLUMNS
    assert values["rtt_probe_ms"] is None and values["t_start_s"] is None and values["error"] == ""
