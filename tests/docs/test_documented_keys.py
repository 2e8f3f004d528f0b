"""docs/experiments.md documents every experiment key, and only real ones: its tables are
checked against the config dataclasses an experiment file is parsed into."""

import re
import typing
from dataclasses import MISSING, fields

import pytest

from dsd.backends.factory import BACKEND_CONFIGS
from dsd.costs.profiles import HardwareProfile
from orchestrator.spec.experiment import Experiment
from tests.docs.pages import documented_names, section, section_text
from tests.checks import every

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
    tables = {"backend", "sampling", "workload", "link", "external", "hardware_profiles", "load", "slo", "cache"}
    assert section(documented_names(PAGE), "Top-level keys") == _names(Experiment) - tables


@pytest.mark.parametrize("table", ["sampling", "workload", "link", "external", "load", "slo", "cache"])
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
    from orchestrator.links.keys import EDGE_KEYS  # noqa: I001

    text = section_text(PAGE, "[link]")
    named = set(re.findall(r"[a-z_]+", text))
    assert sorted((set(EDGE_KEYS) | set(STEP_KEYS) | {"at_s"}) - named) == []
    assert every(column in text for column in TRACE_COLUMNS)


def _documented_defaults(marker: str) -> dict[str, object]:
    """key -> the default a section's table gives as a TOML literal in backticks (rows that give
    prose, such as "(required)", are left out)."""
    import tomllib

    defaults = {}
    for line in section_text(PAGE, marker).splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or not re.fullmatch(r"`[^`]+`", cells[1]) or not re.fullmatch(r"`[^`]+`", cells[2]):
            continue
        defaults[cells[1].strip("`")] = tomllib.loads(f"v = {cells[2].strip('`')}")["v"]
    return defaults


def _same_default(documented, default) -> bool:
    if isinstance(default, tuple):
        return list(default) == (documented if isinstance(documented, list) else [documented])
    if not isinstance(default, (str, int, float, bool, type(None))):
        return isinstance(documented, list) and not documented and not default  # an empty table or list
    return documented == default


@pytest.mark.parametrize(
    "marker, table",
    [
        ("Top-level keys", None),
        ("[sampling]", "sampling"),
        ("[workload]", "workload"),
        ("[link]", "link"),
        ("[load]", "load"),
        ("[slo]", "slo"),
        ("[external]", "external"),
        ("[cache]", "cache"),
    ],
)
def test_each_documented_default_is_its_dataclass_default(marker, table):
    cls = Experiment if table is None else _table_class(table)
    declared = {
        f.name: f.default if f.default_factory is MISSING else f.default_factory()
        for f in fields(cls)
        if f.default is not MISSING or f.default_factory is not MISSING
    }
    documented = _documented_defaults(marker)
    assert documented
    wrong = {
        key: (value, declared.get(key, "no default"))
        for key, value in documented.items()
        if key not in declared or not _same_default(value, declared[key])
    }
    assert wrong == {}
