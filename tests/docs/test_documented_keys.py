"""docs/experiments.md documents every experiment key, and only real ones: its tables are
checked against the config dataclasses an experiment file is parsed into."""
import re
import typing
from dataclasses import fields

import pytest

from dsd.backends.factory import BACKEND_CONFIGS
from dsd.profiles import HardwareProfile
from orchestrator.experiment import Experiment
from tests.docs.pages import documented_names, section, section_text

PAGE = "experiments.md"


def _table_class(name: str):
    """The dataclass behind one of Experiment's tables, found from Experiment itself so the test
    follows the code wherever the class lives."""
    field = Experiment.__dataclass_fields__[name]
    if callable(field.default_factory):
        return type(field.default_factory())
    hint = typing.get_type_hints(Experiment)[name]
    return next(a for a in typing.get_args(hint) if a is not type(None))


def _names(cls) -> set[str]:
    return {f.name for f in fields(cls)}


def test_top_level_keys_match_the_experiment_dataclass():
    # The file's tables are documented in their own sections; `profiles` fills hardware_profiles.
    tables = {"backend", "sampling", "workload", "link", "external", "hardware_profiles", "load", "slo"}
    assert section(documented_names(PAGE), "Top-level keys") == _names(Experiment) - tables


@pytest.mark.parametrize("table", ["sampling", "workload", "link", "external", "load", "slo"])
def test_each_table_documents_its_dataclass_fields(table):
    assert section(documented_names(PAGE), f"[{table}]") == _names(_table_class(table))


def test_backend_table_documents_every_kind_and_its_fields():
    expected = {"kind"}.union(*(_names(cls) for cls in BACKEND_CONFIGS.values()))
    assert section(documented_names(PAGE), "[backend]") == expected


def test_profile_table_documents_every_number_of_a_hardware_profile():
    expected = _names(HardwareProfile) - {"name", "sources"}
    assert section(documented_names(PAGE), "[profiles.NAME]") == expected


def test_link_table_names_every_per_edge_key_schedule_key_and_trace_column():
    from netem.schedule import STEP_KEYS, TRACE_COLUMNS
    from orchestrator.link_keys import EDGE_KEYS  # noqa: I001

    text = section_text(PAGE, "[link]")
    named = set(re.findall(r"[a-z_]+", text))
    assert sorted((set(EDGE_KEYS) | set(STEP_KEYS) | {"at_s"}) - named) == []
    assert all(column in text for column in TRACE_COLUMNS)
