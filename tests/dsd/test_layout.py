"""dsd/ is a map of its roles: packages by role (docs/architecture.md names each and draws their
order, which import-linter checks), and at the top level only what every package shares."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dsd"
SHARED = [
    "__init__.py",
    "checks.py",
    "features.py",
    "modes.py",
    "pair_manifest.py",
    "provenance.py",
    "sequence.py",
    "text.py",
]
PACKAGES = ["analytic", "backends", "cache", "controller", "costs", "drive", "simulation", "speculation"]


def test_the_top_level_holds_only_what_every_package_shares():
    top = sorted(p.name for p in ROOT.iterdir() if p.suffix == ".py")
    assert top == SHARED
    assert len(top) <= 12


def test_every_package_is_in_the_architecture_page():
    packages = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert packages == PACKAGES
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    assert [name for name in PACKAGES if f"**`{name}/`**" not in page] == []
