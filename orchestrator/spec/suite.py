"""Suite files (TOML): several experiment files run as one job, one after another, each into a
folder of its own, then set side by side (orchestrator/report/side_by_side.py). A suite file
has a name and the list of its experiment files, taken from the suite file's folder."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from dsd.checks import check

SUITE_KEYS = ("name", "experiments")
SUITE_RECORD = "suite.json"  # in a suite's result folder: its name and members


@dataclass(frozen=True)
class Suite:
    name: str
    experiments: tuple[Path, ...]  # experiment files, run in this order

    def __post_init__(self) -> None:
        where = "suite key"
        check(
            isinstance(self.name, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,64}", self.name) is not None,
            "name",
            self.name,
            "1-64 of [A-Za-z0-9._-]",
            where,
        )
        check(
            len(self.experiments) >= 1, "experiments", self.experiments, "a non-empty list of experiment files", where
        )
        check(
            len(set(self.experiments)) == len(self.experiments),
            "experiments",
            [str(p) for p in self.experiments],
            "each experiment file once",
            where,
        )
        for path in self.experiments:
            check(path.is_file(), "experiments", str(path), "experiment files that exist", where)


def is_suite_file(path: Path) -> bool:
    """Whether a TOML file is a suite (it lists experiments) rather than an experiment."""
    try:
        return "experiments" in tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False


def load_suite(path: Path) -> Suite:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    unknown = sorted(set(data) - set(SUITE_KEYS))
    if unknown:
        raise ValueError(
            f"{path}: unknown key(s) {unknown} in a suite file; known: {list(SUITE_KEYS)} "
            "(an experiment's keys belong in its own file)"
        )
    files = data.get("experiments")
    if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
        raise ValueError(f"{path}: experiments: expected a list of experiment file paths, got {files!r}")
    if "name" not in data:
        raise ValueError(f"{path}: missing key 'name'")
    try:
        return Suite(data["name"], tuple((path.parent / f).resolve() for f in files))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
