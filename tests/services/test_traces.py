"""The trace rows: keywords only, and the one steady-state definition every launcher uses."""

import pytest

from dsd.costs.compute_times import steady_per_token_s
from services.traces import REQUEST_COLUMNS, RequestRow, RoundRow, as_dict


def test_steady_per_token_time_is_the_time_after_the_first_emission_over_the_tokens_after_it():
    assert steady_per_token_s(0.5, 1.5, 4) == pytest.approx(0.25)
    assert steady_per_token_s(0.5, 0.5, 0) is None  # everything came in the first emission
    assert steady_per_token_s(None, None, 3) is None  # nothing was emitted


def test_rows_are_built_with_keywords_only_and_leave_unmeasured_columns_empty():
    with pytest.raises(TypeError):
        RoundRow("run", "0", "sync", 4, 0, 0, 4, 2, 3, False)
    row = RequestRow(
        run_id="run",
        client_id="0",
        mode="ar",
        gamma=4,
        request_index=0,
        prompt_tokens=8,
        tokens=3,
        rounds=3,
        stale_rounds=0,
        token_ids="1 2 3",
    )
    values = as_dict(row)
    assert tuple(values) == REQUEST_COLUMNS
    assert values["rtt_probe_ms"] is None and values["t_start_s"] is None and values["error"] == ""


def test_round_rows_are_written_at_the_loops_next_turn_in_order_and_before_a_request_row(tmp_path):
    import asyncio
    import csv

    from services.traces import TraceWriter

    def rows(name):
        with open(tmp_path / "run" / name) as f:
            return list(csv.DictReader(f))

    def round_row(i):
        return RoundRow(
            run_id="run",
            client_id="0",
            mode="sync",
            gamma=4,
            request_index=0,
            round_index=i,
            proposed=4,
            accepted=2,
            emitted=3,
            stale=False,
        )

    async def main():
        writer = TraceWriter(tmp_path / "run", {})
        writer.round(round_row(0))
        writer.round(round_row(1))
        assert rows("rounds.csv") == []  # not between a verdict and the next block
        await asyncio.sleep(0)
        assert [r["round_index"] for r in rows("rounds.csv")] == ["0", "1"]  # the next turn, flushed
        writer.round(round_row(2))
        writer.request(
            RequestRow(
                run_id="run",
                client_id="0",
                mode="sync",
                gamma=4,
                request_index=0,
                prompt_tokens=8,
                tokens=9,
                rounds=3,
                stale_rounds=0,
            )
        )
        assert [r["round_index"] for r in rows("rounds.csv")] == ["0", "1", "2"] and len(rows("requests.csv")) == 1
        writer.round(round_row(3))
        writer.close()  # nothing due is dropped
        await asyncio.sleep(0)  # the scheduled write finds nothing left
        assert [r["round_index"] for r in rows("rounds.csv")] == ["0", "1", "2", "3"]

    asyncio.run(main())
    writer = TraceWriter(tmp_path / "no-loop", {})  # outside a loop: written at once
    writer.round(round_row(0))
    with open(tmp_path / "no-loop" / "rounds.csv") as f:
        assert len(list(csv.DictReader(f))) == 1
    writer.close()


def test_a_round_row_given_as_its_builder_is_built_when_written_and_written_alike(tmp_path):
    import asyncio
    import csv

    from services.traces import TraceWriter

    built = []

    def round_row(i):
        built.append(i)
        return RoundRow(
            run_id="run",
            client_id="0",
            mode="sync",
            gamma=4,
            request_index=0,
            round_index=i,
            proposed=4,
            accepted=2,
            emitted=3,
            stale=False,
            t_send_s=1.5,
        )

    async def main():
        writer = TraceWriter(tmp_path / "run", {})
        writer.round(lambda: round_row(0))
        writer.round(round_row(1))
        assert built == [1]  # the builder waits for the write
        await asyncio.sleep(0)
        assert built == [1, 0]
        writer.close()

    asyncio.run(main())
    with open(tmp_path / "run" / "rounds.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["round_index"] for r in rows] == ["0", "1"] and rows[0] == {**rows[1], "round_index": "0"}
