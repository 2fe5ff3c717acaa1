"""The guards (bundle/guards.py) on real versions: the default thresholds let a model update (every SID
redrawn under a new tag) and normal churn (3% removed, 5% added) through and stop a 40% truncation, a 30%
collapse into shared SIDs and SIDs redrawn under the same tag; each guard's value is its formula over the
diff (property test); --accept-change is recorded in the manifest; `zerogr build --guards` and `zerogr
promote --guards` refuse with exit 6. The same scenarios through `zerogr rebuild`: test_rebuild_guards.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.base.small_files import tomllib
from zerogr_build.bundle import load_manifest, publish_bundle
from zerogr_build.bundle.diff import StepStats, VersionDiff, VersionStats
from zerogr_build.bundle.guards import GuardThresholds, evaluate_guards, guard_version
from zerogr_build.config import load_guard_thresholds
from zerogr_build.index import build_index

from .cli_runs import invoke
from .test_cli_metrics import metrics, value

REPO = Path(__file__).resolve().parent.parent
N, SIZES = 2000, (32, 32, 32)


def scenario(name: str) -> tuple[np.ndarray, np.ndarray, str]:
    """(item ids, SIDs [n, 3], model tag) of the base catalog or one of its successors."""
    rng = np.random.default_rng(7)
    ids = np.arange(N, dtype=np.int64) * 7 + 100
    sids = rng.integers(0, 32, (N, 3))
    if name == "base":
        return ids, sids, "m1"
    if name == "model-update":  # the same items, every SID redrawn by a new model
        return ids, np.random.default_rng(8).integers(0, 32, (N, 3)), "m2"
    if name == "churn":  # 3% removed, 5% added, the rest unchanged
        keep = rng.permutation(N)[: N - 60]
        new = np.arange(100, dtype=np.int64) * 7 + 1_000_000
        return (
            np.concatenate([ids[keep], new]),
            np.concatenate([sids[keep], rng.integers(0, 32, (100, 3))]),
            "m1",
        )
    if name == "truncated":  # the export died after 40% of the rows
        return ids[: N * 4 // 10], sids[: N * 4 // 10], "m1"
    if name == "collapsed":  # a new model whose SIDs collapse: 30% of the items share theirs with another
        new = np.random.default_rng(9).integers(0, 32, (N, 3))
        new[1 : N * 3 // 10 : 2] = new[0 : N * 3 // 10 : 2]
        return ids, new, "m3"
    if name == "redrawn-same-tag":  # SIDs redrawn while the model tag stayed
        return ids, np.random.default_rng(8).integers(0, 32, (N, 3)), "m1"
    raise ValueError(name)


def write_catalog(path: Path, name: str) -> tuple[Path, str]:
    ids, sids, tag = scenario(name)
    pq.write_table(pa.table({"item_id": ids, "sid": sids.tolist()}), path)
    return path, tag


def build(catalog: Path, out: Path, tag: str, *extra) -> object:
    sizes = ("--codebook-sizes", "32,32,32")
    return invoke(
        "build", catalog, "--out", out, *sizes, "--model-version", tag, "-q", "--workers", "1", *extra
    )


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict[str, Path]:
    """One OUT with the base catalog as LATEST (v1) and every successor published unpromoted."""
    root = tmp_path_factory.mktemp("guards")
    made = {}
    for name in ("base", "model-update", "churn", "truncated", "collapsed", "redrawn-same-tag"):
        made[f"{name}.parquet"], tag = write_catalog(root / f"{name}.parquet", name)
        ids, sids, tag = scenario(name)
        index = build_index(sids, SIZES, workers=1)
        fields = {"model_version": tag, "settings": {}}
        made[name] = publish_bundle(
            index, pa.array(ids), root / "out", manifest_fields=fields, promote=name == "base"
        ).path
    return made


@pytest.mark.parametrize(
    ("name", "fired"),
    [
        ("model-update", []),
        ("churn", []),
        ("truncated", ["items_ratio", "items_removed", "distinct_sids_ratio"]),
        ("collapsed", ["shared_sid_items"]),
        ("redrawn-same-tag", ["sid_changed_same_tag"]),
    ],
)
def test_the_defaults_pass_updates_and_churn_and_stop_truncation_and_collapse(versions, name, fired):
    report = guard_version(versions[name], GuardThresholds())
    assert report.against == "v000001"
    assert [c.guard for c in report.fired] == fired
    assert report.refused == bool(fired)
    if name == "model-update":  # a new tag: the SID guard does not apply, and says why
        (sid_check,) = [c for c in report.checks if c.guard == "sid_changed_same_tag"]
        assert sid_check.value > 0.9 and "model tag changed" in sid_check.note


def test_accept_change_is_recorded_in_the_manifest(versions):
    report = guard_version(versions["truncated"], GuardThresholds(), accept_change="  partial  scope\n")
    assert not report.refused and report.accepted == "partial scope"
    manifest = load_manifest(versions["truncated"])  # validated on load
    assert [(g["guard"], g["fired"]) for g in manifest["guards"]] == [
        ("items_ratio", True), ("items_removed", True), ("shared_sid_items", False),
        ("distinct_sids_ratio", True), ("sid_changed_same_tag", False),
    ]  # fmt: skip
    kept = N * 4 // 10  # the truncated export: the first 40% of the base catalog's rows, SIDs unchanged
    assert manifest["changes"] == {
        "against": "v000001", "items_added": 0, "items_removed": N - kept, "items_sid_changed": 0,
        "items_common": kept, "sids_comparable": True, "model_tag_changed": False,
    }  # fmt: skip
    recorded = manifest["accept_change"]
    assert recorded["reason"] == "partial scope" and recorded["against"] == "v000001"
    assert recorded["guards"] == ["items_ratio", "items_removed", "distinct_sids_ratio"]
    with pytest.raises(InputError, match="needs a reason"):
        guard_version(versions["truncated"], GuardThresholds(), accept_change="   ")


@pytest.mark.parametrize(
    ("field", "bad"),
    [("items_added", -1), ("items_common", True), ("against", None), ("sids_comparable", 1)],
)
def test_a_malformed_changes_record_is_refused(field, bad):
    from zerogr_build.base.errors import BundleError
    from zerogr_build.bundle.format import _validate_run_fields

    changes = {"against": "v000001", "items_added": 0, "items_removed": 1, "items_sid_changed": 0,
               "items_common": 2, "sids_comparable": True, "model_tag_changed": False}  # fmt: skip
    _validate_run_fields({"changes": changes}, "m")
    with pytest.raises(BundleError, match=f"changes.*{field}|{field}.*changes"):
        _validate_run_fields({"changes": {**changes, field: bad}}, "m")


def _stats(items: int, distinct: int, shared: int, tag: str) -> VersionStats:
    step = StepStats(0, "sparse", 1, distinct, float(distinct), distinct, distinct)
    return VersionStats("p", 1, tag, (distinct,), items, distinct, shared, 0, 1, (step,))


@given(
    old=st.tuples(st.integers(1, 10**6), st.integers(1, 10**6)),
    new=st.tuples(st.integers(1, 10**6), st.integers(1, 10**6)),
    shared=st.integers(0, 10**6),
    common_share=st.floats(0, 1),
    changed_share=st.floats(0, 1),
    same_tag=st.booleans(),
    limits=st.tuples(*[st.floats(0, 1)] * 5),
)
def test_each_guard_is_its_formula_and_fires_past_its_threshold(
    old, new, shared, common_share, changed_share, same_tag, limits
):
    (old_items, old_distinct), (new_items, new_distinct) = old, new
    common = int(min(old_items, new_items) * common_share)
    changed = int(common * changed_share)
    diff = VersionDiff(
        _stats(old_items, old_distinct, 0, "m1"), _stats(new_items, new_distinct, min(shared, new_items),
        "m1" if same_tag else "m2"), new_items - common, old_items - common, changed, common, True,
    )  # fmt: skip
    thresholds = GuardThresholds(*limits)
    got = {c.guard: c for c in evaluate_guards(diff, thresholds)}
    want = {
        "items_ratio": (new_items / old_items, limits[0], "min"),
        "items_removed": ((old_items - common) / old_items, limits[1], "max"),
        "shared_sid_items": (min(shared, new_items) / new_items, limits[2], "max"),
        "distinct_sids_ratio": (new_distinct / old_distinct, limits[3], "min"),
        "sid_changed_same_tag": (changed / common if common else 0.0, limits[4], "max"),
    }
    assert list(got) == list(want)
    for guard, (measured, limit, bound) in want.items():
        check = got[guard]
        assert (check.value, check.threshold, check.bound) == pytest.approx((measured, limit, bound))
        crossed = measured < limit if bound == "min" else measured > limit
        applies = same_tag or guard != "sid_changed_same_tag"
        assert check.fired == (crossed and applies)


def test_the_guards_table_of_the_default_config_is_the_defaults(tmp_path):
    data = tomllib.loads((REPO / "zerogr_build" / "configs" / "default.toml").read_text())
    assert GuardThresholds(**data["guards"]) == GuardThresholds()
    bad = tmp_path / "bad.toml"
    bad.write_text("[guards]\nmax_items_removed = 1.5\n")
    with pytest.raises(InputError, match="max_items_removed must be in 0..1"):
        load_guard_thresholds(bad)
    bad.write_text("[guards]\nmin_item_ratio = 0.5\n")
    with pytest.raises(InputError, match="unknown setting 'min_item_ratio'"):
        load_guard_thresholds(bad)


def test_build_and_promote_with_guards_refuse_with_exit_6(versions, tmp_path):
    out = versions["base"].parent
    prom = tmp_path / "build.prom"
    refused = build(versions["truncated.parquet"], out, "m1", "--guards", "--metrics-file", prom)
    assert refused.exit_code == 6, refused.output
    assert "guard items_ratio 0.4000 (min 0.8000): FIRED" in refused.stderr and "removed" in refused.stderr
    assert (out / "LATEST").read_text() == "v000001\n"
    got = metrics(prom)
    assert value(got, "build_guard_fired", "build", guard="items_ratio") == 1
    assert value(got, "build_guard_value", "build", guard="items_ratio") == pytest.approx(0.4)
    assert value(got, "job_exit_status", "build") == 6
    kept = build(versions["truncated.parquet"], out, "m1", "--guards", "--no-promote")
    assert kept.exit_code == 6 and "not promoted" in kept.stderr
    vdir = sorted(out.glob("v0*"))[-1]
    assert vdir.name == "v000008" and (out / "LATEST").read_text() == "v000001\n"  # --no-promote: kept

    promoted = invoke("promote", vdir, "--guards")
    assert promoted.exit_code == 6 and (out / "LATEST").read_text() == "v000001\n"
    accepted = invoke("promote", vdir, "--guards", "--accept-change", "a smaller catalog on purpose")
    assert accepted.exit_code == 0, accepted.output
    assert (out / "LATEST").read_text() == "v000008\n"
    assert load_manifest(vdir)["accept_change"]["reason"] == "a smaller catalog on purpose"
    assert invoke("promote", versions["base"]).exit_code == 0  # back to v1 for the other tests
    assert invoke("build", versions["base.parquet"], "--accept-change", "x").exit_code == 2
