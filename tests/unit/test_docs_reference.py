"""The docs match the code: the generated configuration reference names every pipeline field and
settings key (and nothing else), is what the generator writes today, and README.md's relative links
point at files that exist."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from airflow_kafka_backpressure.config import reference as docs_reference
from airflow_kafka_backpressure.config.pipeline import PipelineConfig
from airflow_kafka_backpressure.config.settings import ControllerSettings

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "configuration.md"
RUN = f"run `{docs_reference.COMMAND}` and commit docs/reference/configuration.md"


def _documented(section: str) -> set[str]:
    text = PAGE.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", body, flags=re.M))


@pytest.mark.parametrize(
    ("section", "declared"),
    [("Pipeline fields", PipelineConfig), ("Settings keys", ControllerSettings)],
)
def test_every_declared_name_is_documented_and_nothing_else(section, declared):
    in_code = {f.name for f in fields(declared)}
    if declared is PipelineConfig:  # and the keys of its typed option sets, as <field>.<key>
        in_code |= {
            f"{name}.{o.name}" for name, kind in docs_reference.OPTION_SETS.items() for o in fields(kind)
        }
    in_docs = _documented(section)
    assert not in_code - in_docs, f"{section} missing from {PAGE.name}: {sorted(in_code - in_docs)}; {RUN}"
    assert not in_docs - in_code, f"{section} no longer in the code: {sorted(in_docs - in_code)}; {RUN}"


def test_every_declaration_has_a_doc():
    undocumented = [row[0] for row in docs_reference.pipeline_rows() if not row[-1]]
    undocumented += [row[0] for row in docs_reference.settings_rows() if not row[-1]]
    assert not undocumented, f"declare a doc for {undocumented} where they are declared"


def test_the_committed_page_is_what_the_generator_writes():
    assert PAGE.read_text(encoding="utf-8") == docs_reference.render(), f"{PAGE} is out of date: {RUN}"


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (Python-Markdown's toc slugify)."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h).strip().lower()) for h in headings}


def test_readme_relative_links_point_at_files_and_headings():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [t for t in targets if "://" not in t and not t.startswith(("#", "mailto:"))]
    assert relative, "README.md links into the docs"
    missing = [t for t in relative if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    bad = [t for t in relative if "#" in t and t.split("#", 1)[1] not in _anchors(ROOT / t.split("#", 1)[0])]
    assert not bad, f"README.md links to headings that do not exist: {bad}"
