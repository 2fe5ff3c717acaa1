"""deploy/: the systemd units verify with `systemd-analyze verify`, the Kubernetes manifests hold what a
safe rebuild and pull need (no cluster here: they are parsed and their fields checked), the example ~/.aws
files load in boto3, every zerogr option the recipes use exists, and docs/operations.md shows every file.
"""

from __future__ import annotations

import configparser
import json
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
    serving = _documents("serving.yaml")[("StatefulSet", "recommender")]
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
    assert volumes[mounts["/home/zerogr/.aws"]]["secret"]["secretName"] == "zerogr-aws-push"
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
    serving, secrets = _documents("serving.yaml"), _documents("secrets.example.yaml")
    statefulset = serving[("StatefulSet", "recommender")]
    assert ("Service", statefulset["spec"]["serviceName"]) in serving
    pod = statefulset["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    def mounted(container: str) -> dict[str, dict]:
        return {m["mountPath"]: m for m in containers[container]["volumeMounts"]}

    argv = _zerogr_command(containers["zerogr-pull"]["args"][0])
    assert argv[1] == "pull"
    _known_options(argv)
    out = argv[3]
    assert mounted("zerogr-pull")[out]["name"] == mounted("recommender")[out]["name"]
    assert mounted("recommender")[out].get("readOnly") is True and not mounted("zerogr-pull")[out].get(
        "readOnly"
    )
    # The trust files: each one file of the ConfigMap (subPath), so no directory on their path is the
    # ConfigMap volume's own (world-writable) one, which zerogr would refuse.
    for option, name in (("--trusted-keys", "trusted.pub"), ("--trusted-root", "root.json")):
        mount = mounted("zerogr-pull")[argv[argv.index(option) + 1]]
        assert mount["subPath"] == name and mount["readOnly"] is True
        trust = volumes[mount["name"]]["configMap"]
        assert trust["defaultMode"] & 0o022 == 0  # zerogr refuses a trust file others can write
        assert name in secrets[("ConfigMap", trust["name"])]["data"]
    metrics_dir = str(Path(argv[argv.index("--metrics-file") + 1]).parent)
    exporter = containers["node-exporter"]
    assert f"--collector.textfile.directory={metrics_dir}" in exporter["args"]
    assert mounted("node-exporter")[metrics_dir]["name"] == mounted("zerogr-pull")[metrics_dir]["name"]


def _pod_specs(doc: dict) -> list[dict]:
    """The pod specs a workload manifest runs (none for other kinds)."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "Pod":
        return [spec]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return [spec["template"]["spec"]]
    if kind == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    return []


def _secrets_of(pod: dict, containers: list[dict]) -> set[str]:
    """The Secrets `containers` of `pod` can read: mounted volumes (projected ones too), envFrom and env."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    names = set()
    for container in containers:
        for mount in container.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            if "secret" in volume:
                names.add(volume["secret"]["secretName"])
            for source in volume.get("projected", {}).get("sources", []):
                if "secret" in source:
                    names.add(source["secret"]["name"])
        names |= {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
        names |= {
            e["valueFrom"]["secretKeyRef"]["name"]
            for e in container.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }
    return names


def _shell_containers(pod: dict) -> list[dict]:
    return [c for c in pod["containers"] if c.get("command") == ["/bin/sh", "-c"]]


def test_no_serving_pod_holds_the_push_credentials_and_each_keeps_its_fleet_memory() -> None:
    """The Secrets the pushing container reads (its object-store credentials, its signing key) reach no
    container of any serving pod; each serving pod's pull writes its OUT (and OUT/.tuf/, OUT/.pulled) to
    a claim of its own that outlives the pod, not to a volume that dies with it."""
    cron = _documents("rebuild.yaml")[("CronJob", "zerogr-rebuild")]
    (build_pod,) = _pod_specs(cron)
    pushing = [c for c in _shell_containers(build_pod) if "--push" in _zerogr_command(c["args"][0])]
    push_secrets = _secrets_of(build_pod, pushing + build_pod.get("initContainers", []))
    assert {"zerogr-aws-push", "zerogr-signing-key"} <= push_secrets

    serving = list(yaml.safe_load_all((KUBERNETES / "serving.yaml").read_text()))
    pods = [(doc, pod) for doc in serving for pod in _pod_specs(doc)]
    assert pods
    for doc, pod in pods:
        held = _secrets_of(pod, pod["containers"] + pod.get("initContainers", []))
        assert held and not held & push_secrets, f"{doc['metadata']['name']} mounts {held & push_secrets}"
        pull = next(c for c in _shell_containers(pod) if _zerogr_command(c["args"][0])[1] == "pull")
        out = _zerogr_command(pull["args"][0])[3]
        (mount,) = [m for m in pull["volumeMounts"] if m["mountPath"] == out]
        claims = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
        assert doc["kind"] == "StatefulSet" and mount["name"] in claims, "OUT dies with the pod"
        assert mount["name"] not in {v["name"] for v in pod.get("volumes", [])}
        retention = doc["spec"].get("persistentVolumeClaimRetentionPolicy", {})
        assert retention.get("whenScaled", "Retain") == "Retain" == retention.get("whenDeleted", "Retain")


@pytest.mark.parametrize("version", ["1.29.0", "latest"])
def test_every_kubernetes_manifest_is_valid_for_the_kubernetes_api(version: str) -> None:
    """Each document of deploy/kubernetes/ against the API's own OpenAPI schemas (kubernetes-validate,
    offline), strict: a misspelt or misplaced field is an error, not ignored."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    if version == "latest":
        version = kubernetes_validate.latest_version()
    checked = 0
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = f"{path.name}: {doc['kind']} {doc['metadata']['name']}"
                pytest.fail(f"{where}: {exc.message} at {list(exc.path)}")
            checked += 1
    assert checked >= 8


# ------------------------------------------------------------------------------------- IAM policies


def _allowed(policy: dict) -> list[tuple[set[str], list[str], dict]]:
    """(actions, resources, condition) of each Allow statement of an IAM policy document."""
    rows = []
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        actions, resources = statement["Action"], statement["Resource"]
        rows.append(
            (
                set([actions] if isinstance(actions, str) else actions),
                [resources] if isinstance(resources, str) else resources,
                statement.get("Condition", {}),
            )
        )
    return rows


def test_the_hosts_policy_only_reads_the_prefix_the_pods_pull_and_the_build_box_may_write_it() -> None:
    pod = _documents("serving.yaml")[("StatefulSet", "recommender")]["spec"]["template"]["spec"]
    pull = next(c for c in pod["containers"] if c["name"] == "zerogr-pull")
    remote = {e["name"]: e["value"] for e in pull["env"]}["REMOTE"]
    bucket, prefix = remote.removeprefix("s3://").split("/", 1)
    objects = f"arn:aws:s3:::{bucket}/{prefix}/*"

    hosts = _allowed(json.loads((DEPLOY / "aws" / "read-only-policy.json").read_text()))
    assert set().union(*(actions for actions, _, _ in hosts)) == {"s3:GetObject", "s3:ListBucket"}
    assert any("s3:GetObject" in a and objects in r for a, r, _ in hosts)
    listing = [c for a, r, c in hosts if "s3:ListBucket" in a and r == [f"arn:aws:s3:::{bucket}"]]
    assert listing and all(c["StringLike"]["s3:prefix"] == [f"{prefix}/*"] for c in listing)

    build_box = _allowed(json.loads((DEPLOY / "aws" / "build-box-policy.json").read_text()))
    writes = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
    assert any(writes <= a and objects in r for a, r, _ in build_box)
    catalog = _documents("rebuild.yaml")[("ConfigMap", "zerogr-rebuild")]["data"]["CATALOG"]
    catalog_bucket, catalog_prefix = catalog.removeprefix("s3://").rstrip("/").split("/", 1)
    assert any(
        "s3:GetObject" in a and f"arn:aws:s3:::{catalog_bucket}/{catalog_prefix}/*" in r
        for a, r, _ in build_box
    )


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
