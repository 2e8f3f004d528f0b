"""CHANGELOG.md is a list of dated 0.x releases, newest first, and pyproject's version is the
newest of them."""

import datetime
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$")


def releases() -> list[tuple[tuple[int, ...], datetime.date]]:
    found = []
    for line in (ROOT / "CHANGELOG.md").read_text().splitlines():
        if line.startswith("## ") and line != "## [Unreleased]":
            match = RELEASE.match(line)
            assert match, f"CHANGELOG.md: {line!r} is neither '## [Unreleased]' nor '## [X.Y.Z] - YYYY-MM-DD'"
            version = tuple(int(part) for part in match.group(1).split("."))
            found.append((version, datetime.date.fromisoformat(match.group(2))))
    return found


def test_releases_are_dated_and_newest_first():
    found = releases()
    assert len(found) >= 2
    assert [v for v, _ in found] == sorted({v for v, _ in found}, reverse=True), "versions repeat or are out of order"
    dates = [d for _, d in found]
    assert dates == sorted(dates, reverse=True), "release dates are out of order"


def test_the_package_version_is_the_newest_release():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    newest = ".".join(str(part) for part in releases()[0][0])
    assert version == newest, f"pyproject.toml says {version}, CHANGELOG.md's newest release is {newest}"
