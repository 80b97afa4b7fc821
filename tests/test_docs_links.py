"""Every relative link in the README, docs/ and the examples' READMEs points at a file that exists:
a page that moves (as vime/agent/coding did to vime/envs/coding_agent) must take its links along."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_point_at_files_that_exist(page):
    missing = [target for target in LINK.findall(page.read_text())
               if "://" not in target and not target.startswith("mailto:")
               and not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"
