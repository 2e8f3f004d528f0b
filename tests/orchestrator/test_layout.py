"""orchestrator/ is a map of its work: packages by role, each importing only from the packages
below it (docs/architecture.md draws them), and nothing at the top level but the CLI."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "orchestrator"
# docs/architecture.md's picture: each package and the packages below it, which it may import
BASE = {"common", "links", "spec", "records"}
BELOW = {
    "common": set(),
    "links": {"common"},
    "spec": {"common", "links"},
    "records": {"common", "links", "spec"},
    "analysis": BASE,
    "launchers": BASE,
    "report": BASE | {"analysis"},
    "running": BASE | {"analysis", "launchers", "report"},
    "open_loop": BASE | {"analysis", "launchers", "report", "running"},
}


def imports_of(path: Path) -> set[str]:
    """The orchestrator packages a module imports, wherever the import stands (functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "orchestrator" and len(parts) > 1 and parts[1] in BELOW:
                found.add(parts[1])
    return found


def test_the_top_level_holds_only_the_cli():
    top = sorted(p.name for p in ROOT.iterdir() if p.suffix == ".py")
    assert top == ["__init__.py", "__main__.py", "cli.py"]
    packages = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert packages == sorted(BELOW)


def test_every_package_imports_only_from_the_packages_below_it():
    arrows_up = []
    modules = sorted(ROOT.glob("*/*.py"))
    assert modules
    for path in modules:
        package = path.parent.name
        for target in imports_of(path) - {package}:
            if target not in BELOW[package]:
                arrows_up.append(f"{path.relative_to(ROOT)} -> {target}")
    assert arrows_up == []
