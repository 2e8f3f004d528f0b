"""Sub-tables of an experiment file ([sampling], [workload], ...) parsed into their frozen config:
one place that refuses a non-table, names unknown keys, and prefixes the file to any error."""

from __future__ import annotations

from dataclasses import fields


def config_from_table(cls, table, name: str, source: str = "experiment", convert=lambda table: table):
    """cls(**convert(table)); a bad or unknown key is a ValueError naming the table and the key."""
    if not isinstance(table, dict):
        raise ValueError(f"{source}: [{name}] must be a table, got {table!r}")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"{source}: unknown key(s) in [{name}]: {unknown}; known: {known}")
    try:
        return cls(**convert(table))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source}: {error}") from None
