"""Version numbers are bounded (9 digits) and one: against the real S3 API server (moto's server mode).

- a stray object under a huge version number (v + 320 digits, written by anyone who can write the prefix)
  is ignored by push's claim with one warning naming it, and refused by pull, status and promote with
  exit 4 naming it; no command exits 1 for a version number, metrics included;
- pull maps a local path it cannot hold to exit 4;
- a version keeps its number from the build box to the fleet: push claims the local number, or refuses
  with one line when the fleet already holds a higher one; a fleet whose numbers differ from the build
  box's (pushed before they were one) keeps them, and the metrics carry both.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zerogr_build.bundle.format import MAX_VERSION, oversized_version_dir, parse_version_dir
from zerogr_build.cli._metrics import JobMetrics
from zerogr_build.testing import publish_catalog, random_catalog

from .test_fleet import delete, put, remote_keys, samples, served, zerogr

HUGE = "v" + "9" * 320


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@given(st.text(alphabet="0123456789", min_size=0, max_size=40))
def test_a_version_dir_name_is_a_number_of_six_to_nine_digits(digits):
    number = parse_version_dir(f"v{digits}")
    assert number == (int(digits) if 6 <= len(digits) <= 9 else None)
    assert number is None or number <= MAX_VERSION
    assert oversized_version_dir(f"v{digits}") == (len(digits) >= 6 and len(digits.lstrip("0")) > 9)


def test_a_stray_huge_version_wedges_nothing(tmp_path, build_out, remote):
    """The review's reproducer: a signed fleet, v1 pushed and pulled, then one object under v<320 nines>
    written by someone who holds no key."""
    key = tmp_path / "key"
    assert zerogr("keys", "new", str(key))[0] == 0
    signing, trusted = ("--signing-key", str(key)), ("--trusted-keys", f"{key}.pub")
    assert zerogr("push", str(build_out / "v000001"), remote, *signing)[0] == 0
    host = tmp_path / "host"
    assert zerogr("pull", remote, str(host), *trusted)[0] == 0
    put(remote, f"{HUGE}/junk", b"x")

    metrics = tmp_path / "push.prom"
    code, out, err = zerogr(
        "push", str(build_out / "v000002"), remote, *signing, "--json", "--metrics-file", str(metrics)
    )
    assert code == 0, err
    assert json.loads(out)["version"] == 2  # not 10**320: the stray number is ignored
    warning = one_line(err)
    assert "WARNING" in warning and f"{remote}/{HUGE[:16]}...(320 digits)" in warning
    assert "ignored" in warning and HUGE not in warning
    assert samples(metrics)[("zerogr_bundle_version", (("job", "push"),))] == 2
    assert (
        zerogr("pull", remote, str(host), *trusted)[0] == 0 and (host / "LATEST").read_text() == "v000002\n"
    )
    code, _, err = zerogr("promote", f"{remote}/v000001", *signing)  # the documented rollback works
    assert code == 0, err
    assert (
        zerogr("pull", remote, str(host), *trusted)[0] == 0 and (host / "LATEST").read_text() == "v000001\n"
    )

    code, out, _ = zerogr("status", remote, "--json", *trusted)  # the stray prefix: a failing row naming it
    report = json.loads(out)
    assert code == 4 and report["versions"][0]["name"].startswith(f"{HUGE[:16]}...")
    assert "(320 digits): a version number past 999999999" in report["versions"][0]["error"]

    code, _, err = zerogr("promote", f"{remote}/{HUGE}", *signing)
    assert code == 4 and "(320 digits)" in one_line(err)
    put(remote, "LATEST", f"{HUGE}\n".encode())  # the plain LATEST names it: an unsigned pull refuses it
    before = served(host)
    code, _, err = zerogr("pull", remote, str(host), "--allow-unsigned")
    assert code == 4 and f"{remote}/LATEST: names {HUGE[:16]}...(320 digits)" in one_line(err)
    assert served(host) == before
    code, out, err = zerogr("push", str(build_out / "v000002"), remote, "--allow-unsigned", "--json")
    assert code == 0 and json.loads(out)["version"] == 2  # pushed before; LATEST's huge number ignored
    assert f"{remote}/LATEST: names {HUGE[:16]}...(320 digits)" in err and "ignored" in err
    code, _, err = zerogr("pull", remote, str(host), "--version", str(10**20))
    assert code == 2 and "--version must be between 1 and 999999999" in one_line(err)


def test_metrics_leave_out_a_number_a_float_cannot_hold(tmp_path):
    metrics = JobMetrics("push", tmp_path / "m.prom")
    metrics.bundle(version=10**400, items=3)
    metrics.job_value("previous_version", "doc", 10**400)
    metrics.fleet(latest=10**400, expires=float("inf"))
    metrics.write(0)
    got = samples(tmp_path / "m.prom")
    assert got[("zerogr_bundle_items", (("job", "push"),))] == 3
    assert not [name for name, _ in got if "version" in name or "fleet" in name]


def test_pull_maps_a_local_path_it_cannot_hold_to_exit_4(tmp_path, build_out, remote):
    """An OUT whose own path fits the file system's PATH_MAX but whose OUT/v000001/manifest.json does not:
    the check for an installed version cannot even look there, so the remote version cannot be held."""
    key = tmp_path / "key"
    assert zerogr("keys", "new", str(key))[0] == 0
    assert zerogr("push", str(build_out / "v000001"), remote, "--signing-key", str(key))[0] == 0
    deep = tmp_path
    while len(str(deep)) < 4078:
        deep = deep / ("d" * min(200, 4078 - len(str(deep)) - 1))
        deep.mkdir()
    code, _, err = zerogr("pull", remote, str(deep), "--allow-unsigned")
    assert code == 4 and f"{remote}/v000001: its local path" in one_line(err) and "too long" in err
    code, _, err = zerogr("pull", remote, str(deep), "--trusted-keys", f"{key}.pub")
    assert code == 2 and f"{deep}/.tuf" in one_line(err) and "shorter path" in err
    assert not list(deep.glob("v*")) and not (deep / "LATEST").exists()


def test_push_claims_the_local_number_and_refuses_a_fleet_ahead_of_it(tmp_path, remote):
    """A fleet pushed before numbers were one: its v5 is the build box's v2. Pushing v2 again changes
    nothing; the next local version (v3) is refused with the fix; numbered past the fleet, it pushes."""
    box = tmp_path / "box"
    publish_catalog(random_catalog(seed=1), box)
    publish_catalog(random_catalog(seed=2), box)
    assert zerogr("push", str(box / "v000002"), remote, "--no-promote")[0] == 0
    objects = remote_keys(remote)
    for name, data in objects.items():  # renumber the fleet's copy as the old numbering did: v2 -> v5
        if name.startswith("v000002/"):
            if name.endswith("manifest.json"):
                manifest = json.loads(data)
                manifest["version"] = 5
                data = json.dumps(manifest).encode()
            put(remote, "v000005/" + name.split("/", 1)[1], data)
    put(remote, "LATEST", b"v000005\n")
    for name in objects:
        delete(remote, name)

    metrics = tmp_path / "push.prom"
    code, out, err = zerogr("push", str(box / "v000002"), remote, "--json", "--metrics-file", str(metrics))
    result = json.loads(out)
    assert code == 0 and result["version"] == 5 and result["local_version"] == 2 and not result["uploaded"]
    got = samples(metrics)
    assert got[("zerogr_bundle_version", (("job", "push"),))] == 2
    assert got[("zerogr_bundle_remote_version", (("job", "push"),))] == 5

    publish_catalog(random_catalog(seed=3), box)
    before = remote_keys(remote)
    code, out, err = zerogr("push", str(box / "v000003"), remote)
    line = one_line(err)
    assert (
        code == 2 and f"{remote}/v000005: the fleet already holds a version above this one (v000003)" in line
    )
    assert "write 5 into the build box's OUT/.last_version" in line and remote_keys(remote) == before
    (box / ".last_version").write_text("5\n")
    assert Path(publish_catalog(random_catalog(seed=3), box)[1].path).name == "v000006"
    code, out, err = zerogr("push", str(box), remote, "--json")
    assert code == 0 and json.loads(out)["version"] == 6 and remote_keys(remote)["LATEST"] == b"v000006\n"


@pytest.mark.parametrize("taken", ["claim", "complete"])
def test_a_number_another_version_holds_is_refused(tmp_path, build_out, remote, taken):
    other = tmp_path / "other"
    publish_catalog(random_catalog(seed=9), other)  # another build box's v1
    assert zerogr("push", str(other), remote)[0] == 0
    if taken == "claim":  # a push of it that died after its claim
        for name in remote_keys(remote):
            if name != "v000001/.claim":
                delete(remote, name)
    code, _, err = zerogr("push", str(build_out / "v000001"), remote)
    assert code == 2 and f"{remote}/v000001: holds another version (claimed by" in one_line(err)
