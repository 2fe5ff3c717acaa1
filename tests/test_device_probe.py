"""The device identity named by a child process (base/device_probe.py): the same record device_info gives,
used only when it is one, and a rebuild that reuses its plan never imports torch itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from zerogr_build.base.device import device_info
from zerogr_build.base.device_probe import (
    DeviceInfoProbe,
    accepted_answer,
    complete_record,
    expected_torch_file,
    probe_key,
)
from zerogr_build.bundle import device_memo

from .cli_runs import REPO, TUNE_ARGS, run_rebuild
from .test_tune_rebuild import catalog  # noqa: F401 - the fixture

TORCH_FILE = expected_torch_file()


def fresh_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` in a new interpreter (torch not imported yet), this checkout first on its path."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def answer(info: dict, torch_file: str | None = TORCH_FILE) -> str:
    return json.dumps({"torch_file": torch_file, "info": info}) + "\n"


def cpu_info() -> dict:
    return {k: (v if v is None or isinstance(v, int) else str(v)) for k, v in device_info("cpu").items()}


def test_the_childs_answer_is_the_record_device_info_gives_in_a_fresh_process():
    probed = fresh_python(
        """
        import json, sys
        from zerogr_build.base.device_probe import DeviceInfoProbe
        probe = DeviceInfoProbe("cpu")
        assert probe._proc is not None, "no child started"
        info = probe.info()
        assert "torch" not in sys.modules, "the answer was computed here"
        print(json.dumps(info))
        """
    )
    assert probed.returncode == 0, probed.stderr
    here = fresh_python(
        "import json; from zerogr_build.base.device import device_info; "
        "print(json.dumps({k: v if v is None or isinstance(v, int) else str(v) "
        "for k, v in device_info('cpu').items()}))"
    )
    assert here.returncode == 0, here.stderr
    assert json.loads(probed.stdout) == json.loads(here.stdout)


def test_a_child_thread_count_follows_the_environment_as_torch_does_here():
    probed = fresh_python(
        "import json; from zerogr_build.base.device_probe import DeviceInfoProbe; "
        "print(json.dumps(DeviceInfoProbe('cpu').info()))",
        OMP_NUM_THREADS="1",
    )
    assert probed.returncode == 0, probed.stderr
    assert json.loads(probed.stdout)["threads"] == 1


def test_a_failed_child_falls_back_to_device_info_here():
    probed = fresh_python(
        """
        import json, sys
        from zerogr_build.base import device_probe
        device_probe._CHILD = "import sys; sys.exit(3)"
        info = device_probe.DeviceInfoProbe("cpu").info()
        assert "torch" in sys.modules, "the answer did not come from here"
        print(json.dumps({k: v if v is None or isinstance(v, int) else str(v) for k, v in info.items()}))
        """
    )
    assert probed.returncode == 0, probed.stderr
    assert json.loads(probed.stdout) == cpu_info()


def test_with_torch_already_imported_no_child_is_started():
    import torch  # noqa: F401 - the condition under test

    with DeviceInfoProbe("cpu") as probe:
        assert probe._proc is None
        assert probe.info() == device_info("cpu")


def test_close_ends_a_child_that_still_runs():
    probed = fresh_python(
        """
        import time
        from zerogr_build.base import device_probe
        device_probe._CHILD = "import time; time.sleep(60)"
        probe = device_probe.DeviceInfoProbe("cpu")
        proc = probe._proc
        started = time.perf_counter()
        probe.close()
        assert proc.returncode is not None and time.perf_counter() - started < 10
        """
    )
    assert probed.returncode == 0, probed.stderr


def test_only_a_complete_record_naming_this_torch_is_accepted():
    info = cpu_info()
    assert accepted_answer(answer(info), TORCH_FILE, "cpu") == info
    assert accepted_answer("noise from an import\n" + answer(info), TORCH_FILE, "cpu") == info
    refused = [
        answer(info, "/elsewhere/torch/__init__.py"),  # another torch than this process would import
        answer(info, None),
        answer({k: v for k, v in info.items() if k != "threads"}),  # a field missing
        answer({**info, "extra": 1}),
        answer({**info, "type": "cuda"}),  # not the device asked for
        "",
        "not json\n",
        json.dumps([info]),
    ]
    for text in refused:
        assert accepted_answer(text, TORCH_FILE, "cpu") is None, text
    assert accepted_answer(answer(info), None, "cpu") is None  # no torch here: nothing to compare with


def _rebuild_in_fresh_python(catalog_path, common, marker, patch: str = "") -> dict:
    """`zerogr rebuild --force` in a new interpreter (after `patch`): its exit code and whether it imported
    torch."""
    code = f"""
        import json, sys
        {patch}
        from zerogr_build.cli import main
        try:
            main(["rebuild", {str(catalog_path)!r}, "--force", *{[str(a) for a in common]!r}])
        except SystemExit as exc:
            code = exc.code
        else:
            code = 0
        open({str(marker)!r}, "w").write(json.dumps({{"code": code, "torch": "torch" in sys.modules}}))
        """
    run = fresh_python(code)
    assert run.returncode == 0, run.stderr
    return json.loads(marker.read_text())


def test_a_rebuild_that_reuses_its_plan_never_imports_torch(catalog, tmp_path):  # noqa: F811
    out = tmp_path / "bundles"
    common = ("--out", out, "--codebook-sizes", "16,16,16", "--device", "cpu", "--tune-args", TUNE_ARGS)
    marker = tmp_path / "modules.json"
    memo = device_memo.memo_path(out)
    # A child that would fail makes the run compute the identity itself, importing torch.
    no_child = "from zerogr_build.base import device_probe; device_probe._CHILD = 'import sys; sys.exit(3)'"

    first = run_rebuild(catalog, *common, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # The first run measured: it remembers the identity its tune recorded (torch first imported there).
    assert [e["info"] for e in json.loads(memo.read_text())["entries"]] == [cpu_info()]
    assert _rebuild_in_fresh_python(catalog, common, marker, no_child) == {"code": 0, "torch": False}
    plans = list((out / "v000002" / "plans").glob("*.json"))
    assert len(plans) == 1
    plan = json.loads(plans[0].read_text())
    assert plan["reused_from"]["bundle_version"] == 1
    assert plan["device"] == cpu_info()

    # Without the memo a child names the device, and its answer is remembered.
    memo.unlink()
    assert _rebuild_in_fresh_python(catalog, common, marker) == {"code": 0, "torch": False}
    assert json.loads(next((out / "v000003" / "plans").glob("*.json")).read_text())["device"] == cpu_info()
    assert [e["info"] for e in json.loads(memo.read_text())["entries"]] == [cpu_info()]

    # A damaged memo is the same as none: the run probes again (here its failing child, then torch here).
    memo.write_text('{"format": 1, "entries": [{"key": 3}]')
    assert _rebuild_in_fresh_python(catalog, common, marker, no_child) == {"code": 0, "torch": True}


def test_a_known_complete_record_starts_no_child_and_an_incomplete_one_is_ignored():
    probed = fresh_python(
        f"""
        import json, sys
        from zerogr_build.base.device_probe import DeviceInfoProbe
        known = {cpu_info()!r}
        probe = DeviceInfoProbe("cpu", known)
        assert probe._proc is None and probe.info() == known and probe.probed is None
        partial = {{k: v for k, v in known.items() if k != "threads"}}
        probe = DeviceInfoProbe("cpu", partial)
        assert probe._proc is not None, "an incomplete record was trusted"
        assert probe.info() == known and probe.probed == known and "torch" not in sys.modules
        """
    )
    assert probed.returncode == 0, probed.stderr


def test_the_probe_key_changes_with_what_the_cpu_identity_depends_on():
    code = "from zerogr_build.base.device_probe import probe_key; print(probe_key('cpu'))"
    base = fresh_python(code)
    again = fresh_python(code)
    threads = fresh_python(code, OMP_NUM_THREADS="1")
    pinned = fresh_python(f"import os; os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}}); {code}")
    keys = [run.stdout.strip() for run in (base, again, threads, pinned)]
    assert all(len(k) == 64 for k in keys), [run.stderr for run in (base, again, threads, pinned)]
    assert keys[0] == keys[1]
    assert keys[2] != keys[0]
    assert keys[3] != keys[0] or len(os.sched_getaffinity(0)) == 1
    assert probe_key("cuda:0") is None
    import torch  # noqa: F401 - with torch imported here, device_info is cheap: no key

    assert probe_key("cpu") is None


def test_the_memo_keeps_the_newest_entries_and_ignores_what_is_not_a_record(tmp_path):
    info = cpu_info()
    for k in range(device_memo.MAX_ENTRIES + 2):
        device_memo.remember(tmp_path, f"key{k}", {**info, "threads": k + 1})
    entries = json.loads(device_memo.memo_path(tmp_path).read_text())["entries"]
    assert [e["key"] for e in entries] == [f"key{k}" for k in range(device_memo.MAX_ENTRIES + 1, 1, -1)]
    assert device_memo.remembered(tmp_path, "key3", "cpu") == {**info, "threads": 4}
    assert device_memo.remembered(tmp_path, "key0", "cpu") is None  # dropped: the oldest
    device_memo.remember(tmp_path, "bad", {**info, "threads": [1]})
    assert device_memo.remembered(tmp_path, "bad", "cpu") is None
    assert not complete_record({**info, "threads": [1]}, "cpu")
    assert device_memo.remembered(tmp_path, "key3", "cuda:0") is None  # not that device's record
    path = device_memo.memo_path(tmp_path)
    path.unlink()
    os.mkfifo(path)  # a FIFO is never read (the read would hang) nor replaced
    assert device_memo.remembered(tmp_path, "key3", "cpu") is None
    try:
        device_memo.remember(tmp_path, "key3", info)
    except OSError as exc:
        assert "not a regular file" in str(exc)
    else:
        raise AssertionError("a FIFO was replaced")


def test_the_memo_is_never_read_through_a_symlink_or_past_its_size_limit(tmp_path):
    info = cpu_info()
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir(), out.mkdir()
    device_memo.remember(elsewhere, "key", info)
    assert device_memo.remembered(elsewhere, "key", "cpu") == info
    device_memo.memo_path(out).symlink_to(device_memo.memo_path(elsewhere))
    assert device_memo.remembered(out, "key", "cpu") is None  # a symlink in OUT is not OUT's memo
    path = device_memo.memo_path(elsewhere)
    path.write_text(path.read_text().rstrip() + " " * device_memo.MAX_BYTES)  # still JSON, but too large
    assert device_memo.remembered(elsewhere, "key", "cpu") is None
