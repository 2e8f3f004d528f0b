"""The docs site builds strictly: a broken link, a missing page or a page left out of the nav
fails the suite, not a reader."""

from tests.docs.pages import DOCS, ROOT, build_site


def test_the_docs_site_builds_with_strict_checks(tmp_path):
    result = build_site(tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "concepts" / "index.html").exists()


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert [p for p in pages if p not in nav] == []


def test_the_readme_links_only_to_files_that_exist():
    import re

    readme = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)", readme) if not t.startswith("http")]
    assert targets and [t for t in targets if not (ROOT / t).exists()] == []
    assert len(readme.splitlines()) <= 150


def test_the_readme_keeps_the_two_commands_at_the_top_and_a_quickstart_that_needs_nothing():
    import tomllib

    lines = (ROOT / "README.md").read_text().splitlines()
    top = "\n".join(lines[:20])
    assert "./scripts/main.sh" in top and "./scripts/test.sh" in top
    quickstart = "dsdbed sweep experiments/crossover-synthetic.toml"
    assert any(quickstart in line for line in lines)
    experiment = tomllib.loads((ROOT / "experiments" / "crossover-synthetic.toml").read_text())
    assert experiment["launcher"] == "sim" and experiment["backend"]["kind"] == "synthetic"
