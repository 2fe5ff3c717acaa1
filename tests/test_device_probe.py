"""The device identity named by a child process (base/device_probe.py): the same record device_info gives,
used only when it is one, and a rebuild that reuses its plan never imports torch itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from zerogr_build.base.device import device_info
from zerogr_build.base.device_probe import DeviceInfoProbe, accepted_answer, expected_torch_file

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


def test_a_rebuild_that_reuses_its_plan_never_imports_torch(catalog, tmp_path):  # noqa: F811
    out = tmp_path / "bundles"
    common = ("--out", out, "--codebook-sizes", "16,16,16", "--device", "cpu", "--tune-args", TUNE_ARGS)
    first = run_rebuild(catalog, *common, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    marker = tmp_path / "modules.json"
    code = f"""
        import json, sys
        from zerogr_build.cli import main
        try:
            main(["rebuild", {str(catalog)!r}, "--force", *{[str(a) for a in common]!r}])
        except SystemExit as exc:
            code = exc.code
        else:
            code = 0
        open({str(marker)!r}, "w").write(json.dumps({{"code": code, "torch": "torch" in sys.modules}}))
        """
    second = fresh_python(code)
    assert second.returncode == 0, second.stderr
    assert json.loads(marker.read_text()) == {"code": 0, "torch": False}, second.stderr
    plans = list((out / "v000002" / "plans").glob("*.json"))
    assert len(plans) == 1
    plan = json.loads(plans[0].read_text())
    assert plan["reused_from"]["bundle_version"] == 1
    assert plan["device"] == cpu_info()
