"""An intended change of one recorded column is amended in the sim reference, with its reason;
nothing else of the reference moves."""

import json

import pytest

from tests.orchestrator.sim_reference import amend, amend_points, digest


def reference_with(tmp_path, columns):
    path = tmp_path / "ref.json"
    path.write_text(
        json.dumps({"commit": "c0", "experiments": {"x": {"tables": {"points": {"rows": 2, "columns": columns}}}}})
    )
    return path


def test_amend_retakes_one_column_and_records_why(tmp_path):
    path = reference_with(tmp_path, {"a": digest(["1", "2"]), "b": "old"})
    (tmp_path / "runs" / "x").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "points.csv").write_text("a,b\n1,3\n2,4\n")
    assert amend(tmp_path / "runs", "points.b", "c1", "b grew", path) == ["x"]
    ref = json.loads(path.read_text())
    assert ref["experiments"]["x"]["tables"]["points"]["columns"] == {"a": digest(["1", "2"]), "b": digest(["3", "4"])}
    assert ref["amendments"] == [{"column": "points.b", "commit": "c1", "why": "b grew", "experiments": ["x"]}]


@pytest.mark.parametrize("column", ["b", "nope.b", "points."])
def test_amend_names_a_malformed_column(tmp_path, column):
    with pytest.raises(ValueError, match="TABLE.COLUMN"):
        amend(tmp_path, column, "c1", "why", reference_with(tmp_path, {}))


def test_amend_refuses_when_no_run_holds_the_column(tmp_path):
    with pytest.raises(ValueError, match="no experiment"):
        amend(tmp_path, "points.b", "c1", "why", reference_with(tmp_path, {"b": "old"}))


def test_amend_points_retakes_one_experiments_points_and_records_why(tmp_path):
    path = reference_with(tmp_path, {"a": "kept"})
    point = tmp_path / "runs" / "x" / "points" / "sync_rate3.5rps"
    point.mkdir(parents=True)
    (point / "requests.csv").write_text("queue_s\n0.5\n")
    assert amend_points(tmp_path / "runs", "x", "c2", "other rates", path) == 1
    ref = json.loads(path.read_text())
    assert list(ref["experiments"]["x"]["points"]) == ["sync_rate3.5rps"]
    assert ref["experiments"]["x"]["tables"]["points"]["columns"] == {"a": "kept"}
    assert ref["amendments"][-1] == {"column": "points/", "commit": "c2", "why": "other rates", "experiments": ["x"]}
    with pytest.raises(ValueError, match="no experiment"):
        amend_points(tmp_path / "runs", "y", "c2", "why", path)
