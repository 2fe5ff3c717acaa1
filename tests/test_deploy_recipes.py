"""deploy/: the systemd units verify with `systemd-analyze verify`, the Kubernetes manifests hold what a
safe rebuild and pull need (no cluster here: they are parsed and their fields checked), the example ~/.aws
files load in boto3, every zerogr option the recipes use exists, and docs/operations.md shows every file.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .cli_runs import REPO, invoke

DEPLOY = REPO / "deploy"
SYSTEMD = DEPLOY / "systemd"
KUBERNETES = DEPLOY / "kubernetes"
VENV_ZEROGR = "/srv/zerogr/.venv/bin/zerogr"


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def _known_options(argv: list[str]) -> None:
    """Every --option of a `zerogr SUBCOMMAND ...` command line is one that subcommand (for rebuild: or
    build, which receives the rest) lists in its --help."""
    sub = argv[1]
    helps = [invoke(sub, "--help").stdout] + ([invoke("build", "--help").stdout] if sub == "rebuild" else [])
    for option in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
        known = any(re.search(rf"(^|[\s,]){re.escape(option)}\b", h) for h in helps)
        assert known, f"zerogr {sub} has no option {option}"


def _script(exec_start: str) -> str:
    """The shell script a unit's ExecStart runs: the `sh -c` argument, or the command line itself."""
    words = shlex.split(exec_start.replace("$$", "$"))
    return words[2] if words[0].endswith("/sh") and words[1] == "-c" else shlex.join(words)


def _zerogr_command(script: str) -> list[str]:
    """The first `zerogr ...` command of a shell script, as argv from "zerogr" to the end of the command."""
    line = next(line for line in script.splitlines() if re.match(r"\s*(exec\s+)?\S*zerogr\s", line))
    words = shlex.split(line)
    start = next(i for i, w in enumerate(words) if w.endswith("zerogr"))
    end = next((i for i, w in enumerate(words) if w in ("||", "&&", ";", "|")), len(words))
    return ["zerogr", *words[start + 1 : end]]


# ------------------------------------------------------------------------------------------- systemd


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="no systemd-analyze (apt-get install systemd)"
)
def test_the_systemd_units_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` on the four units, with the venv's zerogr path pointed at this test run's
    real zerogr console script (verify checks that ExecStart's program exists): no error, no warning."""
    zerogr = Path(sys.executable).with_name("zerogr")
    if not zerogr.is_file():
        pytest.skip(f"no zerogr console script beside {sys.executable} (pip install -e . makes one)")
    for unit in SYSTEMD.iterdir():
        (tmp_path / unit.name).write_text(unit.read_text().replace(VENV_ZEROGR, str(zerogr)))
    units = sorted(str(p) for p in tmp_path.iterdir())
    done = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_each_timer_starts_its_oneshot_service_that_runs_zerogr() -> None:
    services = {p.stem: _unit(p) for p in SYSTEMD.glob("*.service")}
    assert set(services) == {"zerogr-rebuild", "zerogr-rebuild-cpu", "zerogr-pull"}
    for name, service in services.items():
        timer = _unit(SYSTEMD / f"{name}.timer")
        assert timer["Timer"]["OnCalendar"] and timer["Install"]["WantedBy"] == "timers.target"
        assert timer["Timer"].get("Unit", f"{name}.service") == f"{name}.service"
        body = service["Service"]
        assert body["Type"] == "oneshot" and body["User"] == "zerogr" and "TimeoutStartSec" in body
        argv = _zerogr_command(_script(body["ExecStart"]))
        assert (
            argv[1] == name.removeprefix("zerogr-").removesuffix("-cpu") and VENV_ZEROGR in body["ExecStart"]
        )
        assert "--metrics-file" in argv
        _known_options(argv)


#: The most `systemd-analyze security` may rate each unit (0 safe .. 10 exposed). The GPU rebuild needs
#: the NVIDIA device nodes, so it may score a little worse than the others (its CPU variant has none).
EXPOSURE_LIMITS = {
    "zerogr-pull.service": 4.5,
    "zerogr-rebuild.service": 6.0,
    "zerogr-rebuild-cpu.service": 4.5,
}


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="no systemd-analyze (apt-get install systemd)"
)
def test_each_unit_runs_in_a_sandbox_systemd_rates_safe() -> None:
    """`systemd-analyze security --offline=yes` on each shipped service: its overall exposure is within
    EXPOSURE_LIMITS."""
    for unit, limit in EXPOSURE_LIMITS.items():
        done = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(SYSTEMD / unit)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
        assert found, done.stdout + done.stderr
        assert float(found.group(1)) <= limit, f"{unit}: exposure {found.group(1)} > {limit}\n{done.stdout}"


def _all(path: Path, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in path.read_text().splitlines() if line.startswith(f"{key}=")]


def test_the_sandbox_keeps_what_each_unit_needs_writable_and_nothing_else() -> None:
    """The directives the sandbox rests on, per unit, and the paths the run writes (OUT, the metrics file's
    dir, the report, the caches) are the writable ones: ProtectSystem=strict would otherwise make the
    run fail at its first write."""
    for path in SYSTEMD.glob("*.service"):
        body = _unit(path)["Service"]
        for key, value in (("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                           ("NoNewPrivileges", "yes"), ("CapabilityBoundingSet", ""),
                           ("RestrictNamespaces", "yes"), ("LockPersonality", "yes")):  # fmt: skip
            assert body.get(key) == value, f"{path.name}: {key}={body.get(key)!r}"
        assert _all(path, "SystemCallFilter")[0] == "@system-service", path.name
        families = set(body["RestrictAddressFamilies"].split())
        assert (
            {"AF_INET", "AF_INET6", "AF_UNIX"} <= families <= {"AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"}
        )
        assert "MemoryDenyWriteExecute" not in body, f"{path.name}: numba's JIT needs writable code pages"
        assert "PrivateUsers" not in body, f"{path.name}: root's dirs would look owned by nobody"
        writable = body["ReadWritePaths"].split()
        writable += [f"/var/cache/{d}" for d in body.get("CacheDirectory", "").split()]
        writable += [f"/var/lib/{d}" for d in body.get("StateDirectory", "").split()]
        argv = _zerogr_command(_script(body["ExecStart"]))
        written = [Path(argv[argv.index("--metrics-file") + 1]).parent]
        written += [Path(argv[argv.index("--report") + 1]).parent] if "--report" in argv else []
        written += [Path(argv[3])] if argv[1] == "pull" else [Path("/srv/bundles")]  # OUT
        for line in _all(path, "Environment"):
            caches = (v.split("=", 1) for v in line.split())
            written += [Path(v) for k, v in caches if k.endswith(("CACHE_DIR", "CACHE_HOME", "CACHE_PATH"))]
        for target in written:
            assert any(target.is_relative_to(w) for w in writable), f"{path.name}: {target} is read-only"
    assert _unit(SYSTEMD / "zerogr-pull.service")["Service"]["UMask"] == "0027"
    gpu, cpu = (_unit(SYSTEMD / f"zerogr-rebuild{s}.service")["Service"] for s in ("", "-cpu"))
    assert gpu["UMask"] == cpu["UMask"] == "0077"
    assert _all(SYSTEMD / "zerogr-rebuild.service", "DeviceAllow") == ["char-nvidia* rw"]
    assert gpu["DevicePolicy"] == "closed" and "--gpu 0" in gpu["ExecStart"]
    assert cpu["PrivateDevices"] == "yes" and "DeviceAllow" not in cpu and "--device cpu" in cpu["ExecStart"]
    assert _unit(SYSTEMD / "zerogr-pull.service")["Service"]["PrivateDevices"] == "yes"
    # The two rebuild units run the same job: only the device differs.
    same = gpu["ExecStart"].replace("--gpu 0", "--device cpu")
    assert same == cpu["ExecStart"]


def test_every_shell_script_of_the_recipes_parses() -> None:
    """The `sh -c` scripts of the units and the containers, checked by the shell itself (`sh -n`)."""
    scripts = [_script(_unit(p)["Service"]["ExecStart"]) for p in SYSTEMD.glob("*.service")]
    cron = _documents("rebuild.yaml")[("CronJob", "zerogr-rebuild")]["spec"]["jobTemplate"]
    serving = _documents("serving.yaml")[("Deployment", "recommender")]
    for pod in (cron["spec"]["template"]["spec"], serving["spec"]["template"]["spec"]):
        scripts += [c["args"][0] for c in pod["containers"] if c.get("command") == ["/bin/sh", "-c"]]
    assert len(scripts) == 5
    for script in scripts:
        done = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{done.stderr}\n{script}"


# ---------------------------------------------------------------------------------------- kubernetes


def _documents(name: str) -> dict[tuple[str, str], dict]:
    docs = list(yaml.safe_load_all((KUBERNETES / name).read_text()))
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_the_rebuild_cronjob_runs_one_at_a_time_on_its_volume_with_its_secrets() -> None:
    rebuild, secrets = _documents("rebuild.yaml"), _documents("secrets.example.yaml")
    cron = rebuild[("CronJob", "zerogr-rebuild")]
    assert cron["apiVersion"] == "batch/v1" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] > 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claim = volumes[mounts["/var/lib/zerogr"]]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in rebuild
    for volume in volumes.values():
        if "secret" in volume:
            assert ("Secret", volume["secret"]["secretName"]) in secrets
    assert volumes[mounts["/home/zerogr/.aws"]]["secret"]["secretName"] == "zerogr-aws"
    assert {e["name"]: e["value"] for e in container["env"]}["HOME"] == "/home/zerogr"
    argv = _zerogr_command(container["args"][0])
    _known_options(argv)
    key = argv[argv.index("--push-signing-key") + 1]
    # The signing key reaches the container with mode 600, copied by the init container from the Secret.
    (init,) = pod["initContainers"]
    assert init["command"][:3] == ["install", "-m", "600"] and init["command"][-1] == key
    assert volumes[mounts[str(Path(key).parent)]]["emptyDir"]["medium"] == "Memory"
    for option in ("--metrics-file", "--report"):
        assert argv[argv.index(option) + 1].startswith("/var/lib/zerogr/"), f"{option} is not on the volume"
    config = rebuild[("ConfigMap", "zerogr-rebuild")]["data"]
    assert "[build]" in config["rebuild.toml"] and config["MODEL_VERSION"]
    assert (
        "/etc/zerogr/rebuild.toml" in mounts
        and argv[argv.index("--config") + 1] == "/etc/zerogr/rebuild.toml"
    )


def test_serving_pods_pull_signed_versions_into_the_dir_the_recommender_follows() -> None:
    deployment = _documents("serving.yaml")[("Deployment", "recommender")]
    pod = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    def mounted(container: str) -> dict[str, dict]:
        return {m["mountPath"]: m for m in containers[container]["volumeMounts"]}

    argv = _zerogr_command(containers["zerogr-pull"]["args"][0])
    assert argv[1] == "pull"
    _known_options(argv)
    out, keys = argv[3], argv[argv.index("--trusted-keys") + 1]
    assert mounted("zerogr-pull")[out]["name"] == mounted("recommender")[out]["name"]
    assert mounted("recommender")[out].get("readOnly") is True and not mounted("zerogr-pull")[out].get(
        "readOnly"
    )
    key_volume = volumes[mounted("zerogr-pull")[str(Path(keys).parent)]["name"]]
    assert key_volume["configMap"]["name"] == "zerogr-trusted-keys"
    assert key_volume["configMap"]["defaultMode"] & 0o022 == 0  # zerogr refuses a key file others can write
    metrics_dir = str(Path(argv[argv.index("--metrics-file") + 1]).parent)
    exporter = containers["node-exporter"]
    assert f"--collector.textfile.directory={metrics_dir}" in exporter["args"]
    assert mounted("node-exporter")[metrics_dir]["name"] == mounted("zerogr-pull")[metrics_dir]["name"]


# ------------------------------------------------------------------------------------------ ~/.aws


def test_the_example_aws_files_load_in_boto3(monkeypatch) -> None:
    boto3 = pytest.importorskip("boto3")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(DEPLOY / "aws" / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(DEPLOY / "aws" / "credentials"))
    default = boto3.Session()
    assert (
        default.get_credentials().access_key == "AKIAEXAMPLEEXAMPLE01" and default.region_name == "us-east-1"
    )
    store = boto3.Session(profile_name="object-store")
    assert store.get_credentials().access_key == "minio-build-box"
    assert store.client("s3").meta.endpoint_url == "https://minio.internal:9000"


# ---------------------------------------------------------------------------------------------- docs


def test_the_operations_page_shows_every_deploy_file() -> None:
    """Each recipe is included as it is (a snippet of the shipped file); the promtool tests and the
    dashboard, too long to read on a page, are named."""
    text = (REPO / "docs" / "operations.md").read_text()
    shipped = sorted(str(p.relative_to(REPO)) for p in DEPLOY.rglob("*") if p.is_file())
    named = [n for n in shipped if n.endswith((".test.yml", ".json"))]
    assert shipped and named
    assert [n for n in shipped if n not in named and f'--8<-- "{n}"' not in text] == []
    assert all(Path(n).name in text for n in named)
