"""``anarchon lint FILE…``: offline, the operator's own checks, every problem with its field path, exit 1 on any."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from tests.harness.cli import ok, one_line_error, run_cli
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.controlplane import REPO
from tests.harness.until import until


def write(path: Path, *docs: object) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_the_examples_are_clean() -> None:
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.yaml"))
    out = ok(run_cli("lint", *examples))
    assert out.strip() == f"{len(examples)} job(s) in {len(examples)} file(s): no problems"


def test_every_problem_with_its_field_path(tmp_path: Path) -> None:
    bad = job_manifest("bad", cron="0 8 * * *", tz="Europe/Pariss", jitter="2h", heartbeat="100ms", maxAttempts=0)
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-ours"}}  # passed over
    path = write(tmp_path / "jobs.yaml", bad, other, job_manifest("fine", every="1m"), ["not", "an", "object"])
    res = run_cli("lint", str(path))
    assert res.returncode == 1, res
    assert res.stdout.splitlines() == [
        f"{path}: document 4: not a Kubernetes object",
        f"{path}: AnarchonJob bad: spec.timeZone: unknown time zone 'Europe/Pariss'",
        f"{path}: AnarchonJob bad: spec.jitter: must be at most 1h, got '2h': it delays every run's start by up to"
        " its value; seconds are enough to spread the claims",
        f"{path}: AnarchonJob bad: spec.heartbeat: must be at least 500ms, got '100ms': each heartbeat is a store"
        " write per running attempt",
        f"{path}: AnarchonJob bad: spec.maxAttempts: must be between 1 and 10, got 0",
        "2 job(s) in 1 file(s): 5 problem(s)",
    ]
    res = run_cli("lint", str(path), "-o", "json")
    assert res.returncode == 1
    assert [(r["job"], len(r["problems"])) for r in json.loads(res.stdout)] == [
        (None, 1),
        ("AnarchonJob bad", 4),
        ("AnarchonJob fine", 0),
    ]


def test_files_that_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("spec: [unclosed\n")
    res = run_cli("lint", str(tmp_path / "broken.yaml"))
    assert res.returncode == 1 and f"{tmp_path / 'broken.yaml'}: not YAML: " in res.stdout
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    assert f"{tmp_path / 'empty.yaml'}: no AnarchonJob in it" in run_cli("lint", str(tmp_path / "empty.yaml")).stdout
    res = run_cli("lint", str(tmp_path / "absent.yaml"))
    assert res.returncode == 1 and f"{tmp_path / 'absent.yaml'}: cannot read: No such file or directory" in res.stdout
    one_line_error(run_cli("lint"), 2, "the following arguments are required: FILE")


def test_lint_says_what_the_operator_says(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    """A job the API server admits but the operator cannot run: lint lists the problems of its Invalid condition."""
    job = job_manifest("never", cron="0 8 31 2 *", tz="Mars/Olympus_Mons")
    path = write(tmp_path / "never.yaml", job)
    (linted,) = [r for r in yaml.safe_load(run_cli("lint", str(path), "-o", "yaml").stdout) if r["job"]]
    assert len(linted["problems"]) == 2, linted
    cluster.kubectl("apply", "-f", str(path))  # admitted: the CRD cannot know zones or calendars
    replicas_factory(f"sqlite://{tmp_path / 'store.db'}").start("replica-a")

    def invalid() -> str | None:
        conditions = ((cluster.get("anarchonjob", "never") or {}).get("status") or {}).get("conditions") or []
        return next((c["message"] for c in conditions if c["type"] == "Invalid" and c["status"] == "True"), None)

    assert until("the Invalid condition", invalid, timeout=60) == "; ".join(linted["problems"])


def test_cron_shorthands(tmp_path: Path) -> None:
    """CronJob's ``@hourly`` and the rest pass; one it does not take is refused in words."""
    good = [
        job_manifest(f"j{m[1:]}", cron=m) for m in ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly")
    ]
    path = write(tmp_path / "good.yaml", *good)
    assert ok(run_cli("lint", str(path))).strip() == f"{len(good)} job(s) in 1 file(s): no problems"
    path = write(tmp_path / "bad.yaml", job_manifest("bad", cron="@every 5m"))
    res = run_cli("lint", str(path))
    assert res.returncode == 1
    assert f"{path}: AnarchonJob bad: spec.cron: '@every 5m' is not a cron expression of 5 fields" in res.stdout
    assert "or one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly" in res.stdout, res.stdout


TYPOS = """\
apiVersion: anarchon.io/v1alpha1
kind: AnarchonJob
metadata: {name: moved}
spec:
  schedule: "0 8 * * *"
  cron: "0 8 * * *"
  timezone: Europe/Paris
  concurrencyPolicy: Forbid
  sucessfulRunsHistoryLimit: 5
  failedJobsHistoryLimit: 2
  template:
    spec:
      containers:
        - name: main
          image: busybox
          resource: {limits: {cpu: 500m}}
          ports: [{containerPort: "80"}]
"""


def test_the_crds_schema_catches_typos_down_into_the_pod_template(tmp_path: Path) -> None:
    """What the API server prunes without strict validation (the job would run in UTC, without its
    limits) is a problem, with the field meant; CronJob's names get the AnarchonJob's."""
    path = tmp_path / "moved.yaml"
    path.write_text(TYPOS)
    res = run_cli("lint", str(path))
    assert res.returncode == 1, res
    where = f"{path}: AnarchonJob moved: "
    assert res.stdout.splitlines() == [
        where + "spec.schedule: unknown field; did you mean cron? (CronJob's name)",
        where + "spec.timezone: unknown field; did you mean timeZone?",
        where + "spec.concurrencyPolicy: unknown field; did you mean overlap? (CronJob's name)",
        where + "spec.sucessfulRunsHistoryLimit: unknown field; did you mean successfulRunsHistoryLimit?",
        where + "spec.failedJobsHistoryLimit: unknown field; did you mean failedRunsHistoryLimit? (CronJob's name)",
        where + "spec.template.spec.containers[0].resource: unknown field; did you mean resources?",
        where + "spec.template.spec.containers[0].ports[0].containerPort: must be an integer, got string",
        "1 job(s) in 1 file(s): 7 problem(s)",
    ]


def test_the_schemas_types_enums_and_bounds() -> None:
    """The CRD's own bounds, read from its file (the operator's parser words the same ones in lint's output)."""
    from anarchon.cli.crdschema import check_job

    spec = {"every": "x" * 33, "jitter": "1S", "timeout": "", "maxAttempts": 0, "successfulRunsHistoryLimit": 1001}
    spec |= {"overlap": "Sometimes", "suspend": "yes", "template": {"spec": {"containers": "main"}}}
    problems = check_job({"spec": spec})
    assert problems == [
        "spec.every: must be at most 32 characters long, got 33",
        "spec.every: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' does not match the pattern "
        "^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$",
        "spec.jitter: '1S' does not match the pattern ^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$",
        "spec.timeout: must be at least 1 characters long, got ''",
        "spec.maxAttempts: must be at least 1, got 0",
        "spec.successfulRunsHistoryLimit: must be at most 1000, got 1001",
        "spec.overlap: must be one of Skip, Allow, Replace, got 'Sometimes'",
        "spec.suspend: must be a boolean, got string",
        "spec.template.spec.containers: must be an array, got string",
    ], problems


def test_every_file_is_reported_stdin_and_directories(tmp_path: Path) -> None:
    (tmp_path / "jobs" / "more").mkdir(parents=True)
    write(tmp_path / "jobs" / "a.yaml", job_manifest("a", every="1m", timezone="UTC"))
    (tmp_path / "jobs" / "more" / "b.json").write_text(json.dumps(job_manifest("b", every="1m")))
    (tmp_path / "jobs" / "notes.txt").write_text("not a manifest")  # not read: not *.yaml, *.yml, *.json
    (tmp_path / "binary.yaml").write_bytes(b"\x00\xff\xfe\x00")
    res = run_cli("lint", str(tmp_path / "binary.yaml"), str(tmp_path / "jobs"))
    assert res.returncode == 1, res
    assert res.stdout.splitlines() == [
        f"{tmp_path / 'binary.yaml'}: cannot read: not UTF-8 text",
        f"{tmp_path / 'jobs' / 'a.yaml'}: AnarchonJob a: spec.timezone: unknown field; did you mean timeZone?",
        "2 job(s) in 3 file(s): 2 problem(s)",
    ]
    stdin = subprocess.run(
        [sys.executable, "-m", "anarchon", "lint", "-", "-o", "json"],
        input=TYPOS.replace("moved", "piped"),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "operator")},
        timeout=60,
    )
    assert stdin.returncode == 1, stdin
    (piped,) = json.loads(stdin.stdout)
    assert piped["file"] == "-" and piped["job"] == "AnarchonJob piped" and len(piped["problems"]) == 7
    one_line_error(run_cli("lint", "--output", "toml", "-"), 2, "invalid choice")


def test_the_crds_ship_in_the_package(tmp_path: Path) -> None:
    """lint reads the CRD from the package (anarchon/crds, a link to crds/): what a wheel carries
    is the repository's file, and lint works from it with no repository around."""
    from anarchon.cli.crdschema import CRDS

    shipped = (CRDS / "anarchonjobs.anarchon.io.yaml").resolve()
    assert shipped == REPO / "crds" / "anarchonjobs.anarchon.io.yaml"
    assert (
        "crds/*.yaml"
        in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["anarchon"]
    )
    # What setuptools puts in a wheel (build_py), from a copy of the tree as the Dockerfile copies it.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "operator", src / "operator", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "crds", src / "crds", ignore=shutil.ignore_patterns("*.py"))
    build = tmp_path / "build"
    subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py", "--build-lib", str(build)],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=120,
    )
    built = build / "anarchon" / "crds" / "anarchonjobs.anarchon.io.yaml"
    assert not built.is_symlink() and built.read_bytes() == shipped.read_bytes()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "t.yaml").write_text(TYPOS)
    res = subprocess.run(
        [sys.executable, "-m", "anarchon", "lint", "t.yaml"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(build)},
        timeout=60,
    )
    assert res.returncode == 1 and res.stdout.splitlines()[-1] == "1 job(s) in 1 file(s): 7 problem(s)", res
