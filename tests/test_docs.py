"""Every ```python block of docs/*.md runs (blocks of one page share a namespace, in a temporary directory).

A block whose leading comment lines contain ``# requires: mod1, mod2`` is skipped when a module is missing, and
one marked ``# doc-test: skip`` (e.g. it needs a running server or cloud storage) is not run.

The guide pages below must run cleanly; other pages (written by other areas) are run too, and a failing block
there is reported as a skip naming the block until its page marks it.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
_REQUIRES = re.compile(r"^#\s*requires:\s*(.+)$", re.I)
_SKIP = re.compile(r"^#\s*doc-test:\s*skip\b", re.I)
GUIDE_PAGES = ("index.md", "pytorch_conversion.md", "session_configuration.md", "tuning.md", "profiling.md",
               "custom_ops.md", "logging.md")


def extract_blocks(text: str) -> list[str]:
    return [m.group(1) for m in _BLOCK.finditer(text)]


def requirements(block: str) -> list[str]:
    mods = []
    for line in block.splitlines():
        s = line.strip()
        if not s:
            continue
        if not s.startswith("#"):
            break
        m = _REQUIRES.match(s)
        if m:
            mods.extend(x.strip() for x in m.group(1).split(",") if x.strip())
    return mods


def marked_skip(block: str) -> bool:
    for line in block.splitlines():
        s = line.strip()
        if not s:
            continue
        if not s.startswith("#"):
            return False
        if _SKIP.match(s):
            return True
    return False


def _pages():
    return sorted(DOCS.glob("*.md")) if DOCS.is_dir() else []


def test_extract_blocks_and_requirements():
    text = "intro\n```python\n# requires: torch, foo\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\n```\n"
    blocks = extract_blocks(text)
    assert blocks == ["# requires: torch, foo\nx = 1\n", "y = 2\n"]
    assert requirements(blocks[0]) == ["torch", "foo"]
    assert requirements(blocks[1]) == []
    assert marked_skip("# doc-test: skip\nserver()\n") and not marked_skip("x = 1  # doc-test: skip\n")


def test_expected_pages_exist():
    names = {p.name for p in _pages()}
    for page in GUIDE_PAGES:
        assert page in names, f"docs/{page} is missing"


def test_relative_links_resolve():
    for page in _pages():
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", page.read_text()):
            assert (DOCS / target).exists(), f"{page.name} links to missing {target}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_page_examples_run(page, tmp_path, monkeypatch):
    blocks = extract_blocks(page.read_text(encoding="utf-8"))
    if not blocks:
        pytest.skip("no python blocks")
    monkeypatch.chdir(tmp_path)
    from onnxpy import custom_ops, logging_utils

    registered_before = set(custom_ops.list_registered())
    ns: dict = {"__name__": f"docs_{page.stem}"}
    skipped = []
    try:
        for i, block in enumerate(blocks):
            missing = [m for m in requirements(block) if importlib.util.find_spec(m) is None]
            if missing or marked_skip(block):
                skipped.append((i, missing or "marked"))
                continue
            code = compile(block, f"{page.name}[block {i + 1}]", "exec")
            try:
                exec(code, ns)  # noqa: S102 - the documentation's own examples
            except Exception as e:
                if page.name in GUIDE_PAGES:
                    raise
                pytest.skip(f"{page.name} block {i + 1} fails ({type(e).__name__}: {str(e)[:120]}); mark blocks "
                            "that cannot run in tests with '# doc-test: skip'")
    finally:
        logging_utils.set_default_logger_callback(None)
        for dom, op, since in set(custom_ops.list_registered()) - registered_before:
            custom_ops.unregister(dom, op, since)
        os.chdir(tmp_path)
    if skipped and len(skipped) == len(blocks):
        pytest.skip(f"every block needs a missing module: {skipped}")
