"""The shipped sim experiments' CSVs as a commit wrote them, column by column, for
tests/orchestrator/test_sim_identity.py: per merged table a digest of each column's cells, and
per point one digest of each of its own tables (points/<key>/), over the columns the commit wrote.

    python -m tests.orchestrator.sim_reference OUT_ROOT COMMIT

writes sim_reference.json beside this file from OUT_ROOT/<experiment>/, each made at COMMIT by
`dsdbed sweep experiments/<experiment>.toml --out OUT_ROOT/<experiment>`.

    python -m tests.orchestrator.sim_reference amend OUT_ROOT TABLE.COLUMN COMMIT "why"

re-takes one merged table's column from the runs under OUT_ROOT (made at COMMIT) where the
change is intended, and records the amendment, its commit and its reason beside the reference's.

    python -m tests.orchestrator.sim_reference amend-points OUT_ROOT EXPERIMENT COMMIT "why"

re-takes one experiment's points (their names and their own tables' digests), for a change that
moves which points a sweep runs (an open-loop rate search that lands on other rates).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().with_name("sim_reference.json")
EXPERIMENTS = (
    "acceptance-trace",
    "adaptive-sim",
    "crossover-synthetic",
    "gamma-opt",
    "geography",
    "measured-rural-n8-v10",
    "measured-urban-n78-v0",
    "measured-urban-n78-v30",
    "measured-urban-n8-v30",
    "measured-w2s-n78-v30",
    "serving",
)
TABLES = ("rounds", "requests", "links", "points")
POINT_TABLES = ("rounds", "requests")
# what differs between two runs of the same code: the run ids and the host's clock and load
UNCOMPARED = {"run_id", "measured_started_s", "cpu_busy_pct", "cpu_steal_pct", "load_avg_1m", "contended"}


def read_columns(path: Path) -> dict[str, list[str]]:
    """A CSV's columns as written (the cells' text); {} for a missing or empty file."""
    rows = list(csv.reader(io.StringIO(path.read_text()))) if path.exists() else []
    if not rows:
        return {}
    header, body = rows[0], rows[1:]
    return {name: [row[i] for row in body] for i, name in enumerate(header)}


def digest(cells: list[str]) -> str:
    return hashlib.sha256("\x1f".join(cells).encode()).hexdigest()[:16]


def compared(columns: dict[str, list[str]]) -> list[str]:
    return [c for c in columns if c not in UNCOMPARED]


def table_digest(columns: dict[str, list[str]]) -> dict:
    """The table's rows and, per compared column, the digest of its cells."""
    return {
        "rows": len(next(iter(columns.values()), [])),
        "columns": {c: digest(columns[c]) for c in compared(columns)},
    }


def point_digest(columns: dict[str, list[str]], names: list[str]) -> str:
    """One digest of a point's table over the named columns, in their order."""
    return digest([digest(columns[c]) if c in columns else "(missing)" for c in names])


def experiment_digest(folder: Path) -> dict:
    """The merged tables' digests, and each point's over its experiment's point columns (those
    of its first point)."""
    tables = {t: table_digest(read_columns(folder / f"{t}.csv")) for t in TABLES if (folder / f"{t}.csv").exists()}
    points = sorted(p for p in (folder / "points").iterdir() if p.is_dir())
    names = {t: compared(read_columns(points[0] / f"{t}.csv")) if points else [] for t in POINT_TABLES}
    return {
        "tables": tables,
        "point_columns": names,
        "points": {
            p.name: {t: point_digest(read_columns(p / f"{t}.csv"), names[t]) for t in POINT_TABLES} for p in points
        },
    }


def amend(out_root: Path, table_column: str, commit: str, why: str, reference_path: Path = REFERENCE) -> list[str]:
    """Re-take TABLE.COLUMN's digest for every experiment run under out_root whose reference
    holds it; the amendment is kept in the reference's "amendments". The experiments amended."""
    table, _, column = table_column.partition(".")
    if table not in TABLES or not column:
        raise ValueError(f"amend needs TABLE.COLUMN with TABLE one of {TABLES}, got {table_column!r}")
    reference = json.loads(reference_path.read_text())
    amended = []
    for name, want in reference["experiments"].items():
        path = out_root / name / f"{table}.csv"
        if column not in want["tables"].get(table, {}).get("columns", {}) or not path.exists():
            continue
        cells = read_columns(path)
        if column not in cells:
            raise ValueError(f"{path} has no column {column}")
        want["tables"][table]["columns"][column] = digest(cells[column])
        amended.append(name)
    if not amended:
        raise ValueError(f"no experiment under {out_root} holds {table_column} in the reference")
    reference.setdefault("amendments", []).append(
        {"column": table_column, "commit": commit, "why": why, "experiments": amended}
    )
    reference_path.write_text(json.dumps(reference, sort_keys=True, separators=(",", ":")) + "\n")
    return amended


def amend_points(out_root: Path, experiment: str, commit: str, why: str, reference_path: Path = REFERENCE) -> int:
    """Re-take EXPERIMENT's points from its run under out_root; kept in "amendments". The points."""
    reference = json.loads(reference_path.read_text())
    if experiment not in reference["experiments"]:
        raise ValueError(f"the reference has no experiment {experiment!r}")
    if not (out_root / experiment / "points").is_dir():
        raise ValueError(f"{out_root / experiment} holds no points/ folder")
    got = experiment_digest(out_root / experiment)
    reference["experiments"][experiment].update(points=got["points"], point_columns=got["point_columns"])
    reference.setdefault("amendments", []).append(
        {"column": "points/", "commit": commit, "why": why, "experiments": [experiment]}
    )
    reference_path.write_text(json.dumps(reference, sort_keys=True, separators=(",", ":")) + "\n")
    return len(got["points"])


def main(argv: list[str]) -> None:
    if argv and argv[0] == "amend-points":
        print("points:", amend_points(Path(argv[1]), argv[2], argv[3], argv[4]))
        return
    if argv and argv[0] == "amend":
        print("amended:", ", ".join(amend(Path(argv[1]), argv[2], argv[3], argv[4])))
        return
    out_root, commit = Path(argv[0]), argv[1]
    reference = {
        "commit": commit,
        "uncompared": sorted(UNCOMPARED),
        "experiments": {name: experiment_digest(out_root / name) for name in EXPERIMENTS},
    }
    REFERENCE.write_text(json.dumps(reference, sort_keys=True, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
