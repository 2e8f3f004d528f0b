"""The file paths an experiment file names (a trace, a pair, a workload, a token file), each
relative one taken from the file's folder so that the file runs the same from any working
directory (docs/experiments.md)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


# Every file path an experiment file names, by table and key; a relative one is taken from the
# file's folder (docs/experiments.md). Beside each, where such a path was taken from before
# (checked only when it is not found from the folder, with a warning: a deprecated base).
PATH_KEYS = {
    ("backend", "acceptance_trace"): (),
    ("backend", "pair_path"): (REPO,),
    ("backend", "target_path"): (REPO,),
    ("backend", "draft_path"): (REPO,),
    ("workload", "path"): (Path.cwd, REPO),
    ("link", "trace_csv"): (Path.cwd,),
    ("external", "token_file"): (Path.cwd,),
    ("load", "trace"): (),
    ("load", "lengths_csv"): (),
}


def paths_from_folder(data: dict, folder: Path) -> dict:
    """The experiment file's tables with each relative path of PATH_KEYS made absolute from
    ``folder``, so the file runs the same from any working directory."""
    data = dict(data)
    for (table, key), old_bases in PATH_KEYS.items():
        value = data.get(table, {}).get(key) if isinstance(data.get(table), dict) else None
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            data[table] = {**data[table], key: _from_folder(value, folder, f"{table}.{key}", old_bases)}
    return data


def _from_folder(value: str, folder: Path, key: str, old_bases: tuple) -> str:
    here = Path(os.path.normpath(folder.resolve() / Path(value).expanduser()))
    if here.exists():
        return str(here)
    for base in old_bases:
        before = (base() if callable(base) else base) / Path(value).expanduser()
        if before.exists():
            warnings.warn(
                f"experiment key {key!r}: {value!r} is not found from the experiment file's folder "
                f"({folder}), which relative paths are taken from; taken from {before.parent} as "
                "before, which a later version will not do: write it relative to the file",
                FutureWarning,
                stacklevel=3,
            )
            return str(before.resolve())
    return str(here)
