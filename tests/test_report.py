"""`zerogr report` and `rebuild --report`: the page shows, for each version, what its files record (items,
distinct SIDs, items in shared SIDs counted from the catalog itself, per-step fan-out from the manifest,
the gate's overlap@K from its record, build and tune durations, the guards that fired), escapes every
string a bundle carries, loads nothing from elsewhere, has its tables without matplotlib and its plots
with it, survives an unreadable version, and renders in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.report import report_html
from zerogr_build.report.facts import guard_facts, shared_items

from .cli_runs import REPO, TUNE_ARGS, invoke, run_rebuild
from .test_cli_metrics import metrics, value
from .test_docs_site import _browser, needs_browser

HOSTILE_TAG = '<img src=x onerror=alert(1)>&"m'
CATALOGS = {1: (600, 0), 2: (900, 1)}  # version: (items, seed)


def _catalog(path: Path, items: int, seed: int) -> list[tuple[int, ...]]:
    sids = np.random.default_rng(seed).integers(0, 12, (items, 3))
    pq.write_table(pa.table({"item_id": np.arange(items, dtype=np.int64), "sid": sids.tolist()}), path)
    return [tuple(row) for row in sids.tolist()]


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> dict:
    """Two gated rebuilds into one OUT, the second with --report and --metrics-file; the catalogs' SIDs."""
    work = tmp_path_factory.mktemp("report")
    pq.write_table(pa.table({"request_id": list(range(8))}), work / "requests.parquet")
    sids = {}
    for version, (items, seed) in CATALOGS.items():
        sids[version] = _catalog(work / f"c{version}.parquet", items, seed)
        extra = ["--report", "report.html", "--metrics-file", "m.prom"] if version == 2 else []
        done = run_rebuild(
            f"c{version}.parquet", "--out", "bundles", "--codebook-sizes", "12,12,12", "--device", "cpu",
            "--tune-args", TUNE_ARGS, "--model-version", f"{HOSTILE_TAG}{version}",
            "--gate-model-fn", "tests.compare_models:model_fn", "--gate-requests", "requests.parquet",
            "--min-overlap", "0", "--gate-args", "--k 1,3 --batch-size 4", "--no-guards", *extra,
            cwd=work, env={"PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return {"work": work, "out": work / "bundles", "sids": sids}


class _Tables(HTMLParser):
    """The text of every table cell, by table: [[row cells...]...]."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []
        elif tag == "br" and self.cell is not None:
            self.cell.append("\n")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self.cell).split(" ")).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


class _Elements(HTMLParser):
    """Every element name and every (element, attribute, value) of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: set[str] = set()
        self.attributes: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.elements.add(tag)
        self.attributes += [(tag, name, value or "") for name, value in attrs]


def tables(page: str) -> dict[str, list[dict[str, str]]]:
    """Each table as rows of {header: cell text}, keyed by the h2 title before it (a section that shows a
    paragraph instead has no key)."""
    got = {}
    for chunk in page.split("<h2>")[1:]:
        title, body = chunk.split("</h2>", 1)
        parser = _Tables()
        parser.feed(body)
        if parser.tables and title != "Across versions":
            head, *rows = parser.tables[0]
            got[title] = [dict(zip(head, row, strict=True)) for row in rows]
    return got


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=40), st.integers(1, 7))
def test_shared_items_counts_the_items_on_shared_sids(per_leaf: list[int], chunk: int) -> None:
    offsets = np.concatenate([[0], np.cumsum(per_leaf)]).astype(np.int32)
    assert shared_items(offsets, chunk=chunk) == sum(n for n in per_leaf if n > 1)


def test_the_report_shows_what_each_version_records(rebuilt) -> None:
    out, sids = rebuilt["out"], rebuilt["sids"]
    page = report_html(out, plots=False)
    shown = tables(page)
    rows = {row["version"].split()[0]: row for row in shown["Versions"]}
    assert list(rows) == ["v000001", "v000002"] and "LATEST" in shown["Versions"][1]["version"]
    for version, catalog in sids.items():
        name = f"v{version:06d}"
        row = rows[name]
        per_sid = Counter(catalog)
        in_shared = sum(n for n in per_sid.values() if n > 1)
        assert row["items"] == f"{len(catalog):,}" and row["distinct SIDs"] == f"{len(per_sid):,}"
        assert row["items in shared SIDs"] == f"{in_shared:,} ({100 * in_shared / len(catalog):.2f}%)"
        manifest = json.loads((out / name / "manifest.json").read_text())
        assert row["build s"] == f"{sum(manifest['build_timings'].values()):,.2f}"
        (plan_file,) = (out / name / "plans").glob("*.json")
        plan = json.loads(plan_file.read_text())
        tuned = (
            f"reused from v{plan['reused_from']['bundle_version']:06d}"
            if "reused_from" in plan
            else f"{plan['tune_seconds']:,.1f} s"
        )
        assert row["tune"] == f"{plan_file.stem}: {tuned}"
        steps = next(r for r in shown["Steps"] if r["version"].startswith(name))
        for step in manifest["steps"]:
            cell = steps[f"step {step['step']}: fan-out (max)"]
            assert cell == f"{step['nnz'] / step['rows']:,.2f} ({step['max_slots']:,}) {step['format']}"
        (record_file,) = (out / name / "quality").glob("*.json")
        record = json.loads(record_file.read_text())
        gate = next(r for r in shown["Quality gate"] if r["version"].startswith(name))
        assert gate["model"] == f"{HOSTILE_TAG}{version}"
        for k, share in record["overlap"].items():
            assert gate[f"overlap@{k}"] == f"{100 * share:.2f}%"
    assert "v000001 → v000002" in page
    old, new = sids[1], sids[2]  # item i has SID old[i] / new[i]
    changes = page.split("Changes between the last two versions")[1]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", changes)
    assert dict(zip(cells[::2], cells[1::2], strict=True)) == {
        "items_added": str(len(new) - len(old)), "items_removed": "0",
        "items_sid_changed": str(sum(a != b for a, b in zip(old, new, strict=False))),
        "items_common": str(len(old)), "sids_comparable": "True", "model_tag_changed": "True",
    }  # fmt: skip


def test_the_page_loads_nothing_and_escapes_every_string_of_a_bundle(rebuilt) -> None:
    page = report_html(rebuilt["out"], plots=True)
    parser = _Elements()
    parser.feed(page)
    assert not parser.elements & {"script", "link", "img", "iframe", "object", "embed", "image"}
    for tag, name, text in parser.attributes:  # SVG <use> refers to the page's own ids only
        assert name not in ("src", "srcset", "action", "formaction", "background"), (tag, name)
        assert not name.startswith("on"), (tag, name)
        if name in ("href", "xlink:href"):
            assert text.startswith("#"), (tag, name, text)
    assert not re.search(r"url\((?!#)|@import", page)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "&lt;img src=x onerror=alert(1)&gt;&amp;&quot;m1" in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "two plots share an element id"


def test_plots_are_drawn_by_matplotlib_when_it_is_there(rebuilt) -> None:
    pytest.importorskip("matplotlib")
    page = report_html(rebuilt["out"])
    assert page.count("<svg") == 5 and "Across versions" in page
    assert page.count("<svg") == page.count("</svg>")


def test_without_matplotlib_the_page_has_its_tables(rebuilt, tmp_path: Path) -> None:
    """A Python where matplotlib cannot be imported: the page has no plot, the same tables, and
    `zerogr report --plots` is a one-line usage error."""
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from zerogr_build.report import write_report\n"
        f"write_report({str(rebuilt['out'])!r}, {str(tmp_path / 'r.html')!r})\n"
        "from zerogr_build.cli import main\n"
        f"main(['report', {str(rebuilt['out'])!r}, '-o', {str(tmp_path / 'p.html')!r}, '--plots'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --plots needs matplotlib: install zerogr with its [report] extra"
    ], done.stderr
    page = (tmp_path / "r.html").read_text()
    assert "<svg" not in page and "Across versions" not in page
    assert tables(page) == tables(report_html(rebuilt["out"], plots=False))
    assert not (tmp_path / "p.html").exists()


def test_rebuild_report_writes_the_page_and_the_gate_gauges(rebuilt) -> None:
    work, out = rebuilt["work"], rebuilt["out"]
    page = (work / "report.html").read_text()
    assert [row["version"].split()[0] for row in tables(page)["Versions"]] == ["v000001", "v000002"]
    changes = re.findall(r"<td[^>]*>(.*?)</td>", page.split("Changes between the last two versions")[1])
    assert changes[:2] == ["items_added", str(CATALOGS[2][0] - CATALOGS[1][0])]
    (record_file,) = (out / "v000002" / "quality").glob("*.json")
    record = json.loads(record_file.read_text())
    got = metrics(work / "m.prom")
    assert value(got, "rebuild_gate_worst_overlap", "rebuild") == min(record["overlap"].values())
    assert value(got, "rebuild_gate_min_overlap", "rebuild") == record["thresholds"]["min_overlap"] == 0


def test_a_failed_rebuild_writes_the_report_too(rebuilt, tmp_path: Path) -> None:
    """A run refused with exit 2 (codebook sizes one step short: nothing published) still writes the page
    of OUT's versions, and the run's exit code stands."""
    done = run_rebuild(
        rebuilt["work"] / "c1.parquet", "--out", rebuilt["out"], "--codebook-sizes", "12,12",
        "--device", "cpu", "--report", tmp_path / "after-failure.html", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    page = (tmp_path / "after-failure.html").read_text()
    assert [row["version"].split()[0] for row in tables(page)["Versions"]] == ["v000001", "v000002"]


def test_guards_changes_and_an_unreadable_version_are_shown(rebuilt, tmp_path: Path) -> None:
    """Guards as a manifest records them, the changes of the last two versions, and a version whose
    manifest is broken: its own row says why, the others are shown."""
    out = tmp_path / "out"
    shutil.copytree(rebuilt["out"], out, symlinks=True)
    manifest_path = out / "v000002" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["guards"] = [  # as the guards record them (docs/bundle-format.md section 5)
        {"guard": "items_removed", "value": 0.4, "threshold": 0.1, "bound": "max", "fired": True, "note": ""},
        {"guard": "<b>sid_changed</b>", "value": 0.01, "threshold": 0.2, "bound": "max", "fired": False,
         "note": ""},
    ]  # fmt: skip
    manifest["accept_change"] = {
        "reason": "catalog <cleanup>", "guards": ["items_removed"], "against": "v000001",
        "at": "2026-11-29T20:17:13.000000Z",
    }  # fmt: skip
    manifest_path.write_text(json.dumps(manifest))
    (out / "v000003").mkdir()
    (out / "v000003" / "manifest.json").write_text("{")
    diff = {"items_added": [7, 8], "items_removed": ["<i>9</i>"], "items_sid_changed": [], "note": "<x>"}
    page = report_html(out, plots=False, diff=diff)
    shown = tables(page)
    rows = {row["version"].split()[0]: row for row in shown["Versions"]}
    assert rows["v000003"]["created"].startswith("unreadable: ") and "manifest" in rows["v000003"]["created"]
    assert rows["v000002"]["guards fired"] == "items_removed (accepted: catalog <cleanup>)"
    assert rows["v000001"]["guards fired"] == "not recorded"
    guards = {(r["version"].split()[0], r["guard"]): r for r in shown["Catalog guards"]}
    assert guards[("v000002", "<b>sid_changed</b>")][""] == "ok"
    assert guards[("v000002", "items_removed")]["value"] == "0.4000"
    assert "<b>" not in page and "<i>9" not in page and "<x>" not in page and "<cleanup>" not in page
    assert "v000002 → v000003" in page
    cells = re.findall(r"<td[^>]*>(.*?)</td>", page.split("Changes between the last two versions")[1])
    assert cells[:4] == ["items_added", '2 <span class="muted">7, 8</span>', "items_removed",
                         '1 <span class="muted">&lt;i&gt;9&lt;/i&gt;</span>']  # fmt: skip


def test_the_changes_the_guards_recorded_are_shown_without_comparing_again(rebuilt, tmp_path: Path) -> None:
    """A `changes` record against the version shown before is what the page shows (the guards counted it
    already); one against another version is not, and the two versions are compared instead."""
    out = tmp_path / "out"
    shutil.copytree(rebuilt["out"], out, symlinks=True)
    manifest_path = out / "v000002" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    counts = {"items_added": 12345, "items_removed": 6, "items_sid_changed": 7, "items_common": 8,
              "sids_comparable": True, "model_tag_changed": True}  # fmt: skip

    def shown_added(against: str) -> str:
        manifest_path.write_text(json.dumps({**manifest, "changes": {"against": against, **counts}}))
        page = report_html(out, plots=False)
        return re.findall(r"<td[^>]*>(.*?)</td>", page.split("Changes between the last two versions")[1])[1]

    assert shown_added("v000001") == "12345"
    assert shown_added("v000000") == str(CATALOGS[2][0] - CATALOGS[1][0])


def test_guard_facts_read_both_recorded_shapes() -> None:
    as_map = {"a": {"fired": True, "value": 1, "threshold": 0.5}, "b": "junk"}
    as_list = [{"guard": "a", "fired": True, "value": 1, "threshold": 0.5}, {"fired": True}, 3]
    assert guard_facts(as_map) == guard_facts(as_list)
    (only,) = guard_facts(as_list)
    assert (only.name, only.fired, only.value, only.threshold) == ("a", True, 1, 0.5)
    assert guard_facts(None) == guard_facts("x") == ()


def test_report_cli_refuses_what_it_cannot_show(tmp_path: Path) -> None:
    missing = invoke("report", tmp_path / "nope", "-o", tmp_path / "r.html")
    assert missing.exit_code == 2 and "no such OUT or version dir" in missing.stderr
    assert invoke("report", tmp_path, "-o", tmp_path / "r.html", "--last", "0").exit_code == 2
    empty = invoke("report", tmp_path, "-o", tmp_path / "r.html")
    assert empty.exit_code == 0 and "No versions in this OUT dir yet" in (tmp_path / "r.html").read_text()


PROBE = """
<script>
window.addEventListener("load", () => {
  const svgs = [...document.querySelectorAll("svg")].map((s) => s.getBoundingClientRect().width);
  document.body.setAttribute("data-probe", JSON.stringify({
    tables: document.querySelectorAll("table").length,
    svgs: svgs,
    wide: document.documentElement.scrollWidth > window.innerWidth + 1,
  }));
});
</script>
"""


@needs_browser
def test_the_report_renders_in_chromium(rebuilt, tmp_path: Path) -> None:
    """Headless Chromium lays the page out (its six tables, the rebuild runs' included, every plot with a
    width, nothing wider than the window) and screenshots it (written to the test's temp dir for a human to
    look at)."""
    pytest.importorskip("matplotlib")
    page = report_html(rebuilt["out"])
    probed = tmp_path / "probed.html"  # the probe is a script: the page's own policy would block it
    probed.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page).replace(
        "</body>", PROBE + "</body>"))  # fmt: skip
    done = _browser("--dump-dom", probed.as_uri())
    found = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert found, done.stderr[-2000:]
    probe = json.loads(found.group(1).replace("&quot;", '"'))
    assert probe["tables"] == 6 and len(probe["svgs"]) == 5 and min(probe["svgs"]) > 200, probe
    assert not probe["wide"], "the page is wider than the window"
    (tmp_path / "report.html").write_text(page)
    png = tmp_path / "report.png"
    done = _browser(f"--screenshot={png}", (tmp_path / "report.html").as_uri())
    assert png.is_file() and png.stat().st_size > 20_000, done.stderr[-2000:]
