"""The rendered documentation site, looked at in a real browser (headless Chromium; .ci/run installs it):
no code block is cut off on the right or wraps its lines (each one fits or scrolls with a scrollbar), the
home page fits without scrolling and has the install and first-build commands and a link to the README page,
and the runnable-docs markers (`# needs: ...`) never reach a page. A screenshot of the home page is written to
$ZEROGR_SCREENSHOT_DIR (default: the test's temp dir) for a human to look at."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WINDOW = "1280,900"
PAGES = ("index.html", "readme/index.html", "operations/index.html", "fleet/index.html", "cli/index.html")
PROBE = """
<script>
window.addEventListener("load", () => {
  const blocks = [...document.querySelectorAll(".md-typeset pre > code")].map((code) => {
    const style = getComputedStyle(code);
    const padding = parseFloat(style.paddingTop) + parseFloat(style.paddingBottom);
    return {
      text: code.textContent.slice(0, 60),
      wide: code.scrollWidth > code.clientWidth + 1,
      scrolls: ["auto", "scroll"].includes(style.overflowX),
      visible: code.clientWidth > 0,
      lines: code.textContent.replace(/\\n$/, "").split("\\n").length,
      shown_lines: Math.round((code.scrollHeight - padding) / parseFloat(style.lineHeight)),
    };
  });
  document.body.setAttribute("data-probe", JSON.stringify(blocks));
});
</script>
"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


BROWSER = _chromium()
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def _browser(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={WINDOW}",
         "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def probe(page: Path) -> list[dict]:
    """Every code block of the page as the browser lays it out at WINDOW: is its content wider than its
    box, and does the box scroll."""
    probed = page.with_name(f"probe-{page.name}")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    try:
        done = _browser("--dump-dom", probed.as_uri())
    finally:
        probed.unlink()
    m = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert m, f"{page}: the probe did not run\n{done.stderr[-2000:]}"
    return json.loads(
        m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    )


@needs_browser
@pytest.mark.parametrize("name", PAGES)
def test_no_code_block_is_cut_off(site: Path, name: str) -> None:
    blocks = probe(site / name)
    assert blocks, f"{name}: no code blocks found"
    clipped = [b["text"] for b in blocks if b["wide"] and not b["scrolls"]]
    assert not clipped, f"{name}: code blocks cut off on the right: {clipped}"
    if name == "index.html":  # the home page is read first: everything on it fits, nothing to scroll
        assert not [b["text"] for b in blocks if b["wide"]], "the home page has a block wider than the page"


@needs_browser
def test_a_long_command_line_scrolls_instead_of_wrapping(site: Path) -> None:
    """The README's first set-up command is one bash line longer than the page: its block is wider than
    its box, scrolls sideways, and shows that line as one line (no wrap mid-option)."""
    blocks = probe(site / "readme" / "index.html")
    (setup,) = [b for b in blocks if b["text"].startswith("python -m pip install torch==2.13.0 -e . && zer")]
    assert setup["lines"] == 1 and setup["wide"] and setup["scrolls"], setup
    assert setup["shown_lines"] == 1, f"the line wraps onto {setup['shown_lines']} lines"
    assert all(b["shown_lines"] == b["lines"] for b in blocks if b["visible"]), "a block wraps its lines"


@needs_browser
def test_home_page_screenshot(site: Path, tmp_path: Path) -> None:
    folder = Path(os.environ.get("ZEROGR_SCREENSHOT_DIR", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    png = folder / "docs-home.png"
    done = _browser(f"--screenshot={png}", (site / "index.html").as_uri())
    assert png.is_file() and png.stat().st_size > 10_000, done.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_home_page_has_install_first_build_and_the_readme(site: Path) -> None:
    home = (site / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", home)
    assert "python -m pip install" in text and "zerogr build data/catalog.parquet" in text
    assert "zerogr rebuild" in text
    assert 'href="readme/"' in home
    readme = re.sub(r"<[^>]+>", "", (site / "readme" / "index.html").read_text())
    assert "The pipeline" in readme and "From the build box to the fleet" in readme


def test_no_page_shows_a_test_marker(site: Path) -> None:
    """No code block of any page starts with a `# needs:` line (prose may name the convention)."""

    def shows(page: Path) -> bool:
        blocks = re.findall(r"<pre[^>]*>(.*?)</pre>", page.read_text(), re.DOTALL)
        return any(re.match(r"\s*#\s*needs:", re.sub(r"<[^>]+>", "", b)) for b in blocks)

    shown = [str(p.relative_to(site)) for p in site.rglob("*.html") if shows(p)]
    assert not shown, f"pages showing a `# needs:` marker: {shown}"
    assert any("# needs:" in p.read_text() for p in (REPO / "docs").glob("*.md"))  # the sources have them


def test_strip_test_markers_drops_only_the_marker_line() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("site_text", REPO / "docs_hooks" / "site_text.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    text = "a\n```bash\n# needs: s3\nzerogr push x\n```\n\n```bash\necho '# needs: s3'\n```\n"
    assert (
        hook.strip_test_markers(text)
        == "a\n```bash\nzerogr push x\n```\n\n```bash\necho '# needs: s3'\n```\n"
    )
