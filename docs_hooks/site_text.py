"""mkdocs hook: what the site shows of the Markdown sources.

- The `# needs: ...` first line of a code block is a marker for the runnable-docs test
  (tests_docs/test_docs_examples.py), not for readers: it is dropped from the rendered page.
- The repository's README.md is published as the page readme.md ("README"), its links into docs/ rewritten
  to the pages they name, so the site has the README's content without a copy to keep in step.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parent.parent
README_PAGE = "readme.md"
_NEEDS_AFTER_FENCE = re.compile(
    r"^(?P<fence>[ \t]*(?:`{3,}|~{3,})[^\n]*\n)[ \t]*#\s*needs:[^\n]*\n", re.MULTILINE
)


def strip_test_markers(markdown: str) -> str:
    """The Markdown without the `# needs: ...` line that opens a fenced block."""
    return _NEEDS_AFTER_FENCE.sub(r"\g<fence>", markdown)


def readme_markdown() -> str:
    """README.md with links into docs/ pointing at the site's pages."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\]\(docs/", "](", text)


def on_files(files, config):
    files.append(File.generated(config, README_PAGE, content=readme_markdown()))
    return files


def on_page_markdown(markdown, page, config, files):
    return strip_test_markers(markdown)
