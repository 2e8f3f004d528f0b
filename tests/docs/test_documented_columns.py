"""docs/outputs.md documents every column of every output file, and only real ones: its tables
are checked against the row types the traces are written from, links.csv's row type, the
columns points.csv takes from links.csv, and the files a small sim sweep writes."""

import json
from dataclasses import fields

import pandas as pd
import pytest

from orchestrator.analysis.points import GROUP_KEYS, POINT_KEYS
from orchestrator.launchers.base import LinkState
from orchestrator.links.rows import LINK_POINT_COLUMNS
from services.traces import RequestRow, RoundRow
from tests.docs.pages import documented_names, section, small_sim_sweep

PAGE = "outputs.md"


@pytest.fixture(scope="module")
def docs():
    return documented_names(PAGE)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return small_sim_sweep(tmp_path_factory.mktemp("outputs") / "sweep")


def _names(cls) -> set[str]:
    return {f.name for f in fields(cls)}


def test_point_columns_are_the_analysis_point_and_group_keys(docs):
    assert set(POINT_KEYS) | set(GROUP_KEYS) <= section(docs, "Point columns")


@pytest.mark.parametrize("file, row", [("rounds.csv", RoundRow), ("requests.csv", RequestRow)])
def test_trace_row_types_are_documented(docs, file, row):
    assert _names(row) <= section(docs, f"`{file}`")


def test_links_csv_documents_its_row_type(docs):
    assert _names(LinkState) <= section(docs, "`links.csv`")


def test_points_csv_documents_the_columns_it_takes_from_links_csv(docs):
    assert set(LINK_POINT_COLUMNS.values()) <= section(docs, "`points.csv`")


@pytest.mark.parametrize("file", ["rounds.csv", "requests.csv", "points.csv"])
def test_every_column_a_sim_sweep_writes_is_documented(docs, sweep, file):
    columns = set(pd.read_csv(sweep / file, nrows=1).columns)
    documented = section(docs, f"`{file}`") | section(docs, "Point columns")
    if file == "requests.csv":
        documented |= section(docs, "`rounds.csv`")  # "as in rounds.csv" rows name them there too
    assert sorted(columns - documented) == []


def test_every_documented_trace_column_is_real(docs):
    """The rounds.csv and requests.csv tables name nothing that neither the row type nor the
    analysis adds (the analysis's additions are listed here so a rename shows up)."""
    added = {
        "rounds.csv": {"link_change_index", "link_rtt_configured_ms"},
        "requests.csv": {
            "alpha_measured",
            "distinct_4gram",
            "shaper",
            "link_edge",
            "link_rtt_configured_ms",
            "token_latency_ms_p50",
            "token_latency_ms_p99",
            "longest_gap_ms",
        },
    }
    for file, row in (("rounds.csv", RoundRow), ("requests.csv", RequestRow)):
        assert sorted(section(docs, f"`{file}`") - _names(row) - added[file]) == []


def test_every_summary_key_a_sim_sweep_writes_is_documented(docs, sweep):
    keys = set(json.loads((sweep / "summary.json").read_text()))
    assert sorted(keys - section(docs, "`summary.json`")) == []
