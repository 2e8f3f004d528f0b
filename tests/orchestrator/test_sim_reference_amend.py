"""An intended change of one recorded column is amended in the sim reference, with its reason;
nothing else of the reference moves."""
import json

import pytest

from tests.orchestrator.sim_reference import amend, digest


def reference_with(tmp_path, columns):
    path = tmp_path / "ref.json"
    path.write_text(json.dumps({"commit": "c0", "experiments": {
        "x": {"tables": {"points": {"rows": 2, "columns": columns}}}}}))
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
