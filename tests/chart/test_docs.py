"""The shell commands of README.md and docs/*.md: each one that can run here is run, and says what they show.

Every command of a fenced ``bash``, ``sh`` or ``console`` block (a console block's commands are its
``$`` lines, each followed by the output the docs show) is either run (RUN) or excluded (EXCLUDED,
with a reason); a command that is neither fails :func:`test_every_command_is_run_or_excluded`, and
is never run, so a new one is looked at. Run, each in a block's own working directory (the
repository's top-level entries linked in, so the docs' relative paths work):

* ``anarchon lint`` and ``anarchon next``, offline; in a console block their output must be the
  one shown, and a ``$ cat FILE`` before them writes FILE as shown;
* ``helm install``, ``helm upgrade`` and ``helm template`` as ``helm template`` with the same
  values (install-only flags left out): the chart must accept what the docs tell people to set;
* ``kubectl apply`` as a server-side dry run and ``kubectl explain``, on the test control plane
  with the CRDs installed.

Every file of examples/ is applied by tests/chart/test_examples.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from controlplane import ControlPlane

from tests.chart.chartlib import REPO, tool

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}

#: The CLI's verbs that act on a cluster with replicas at work.
LIVE_VERBS = ("trigger", "list", "describe", "runs", "why", "suspend", "resume", "backfill", "cancel", "get", "follow")
#: Commands not run here, by their first words, each with the reason (and where it is tested instead).
LIVE = "needs a live installation (replicas at work, a release): tests/cli and tests/chart run it there"
EXCLUDED: dict[tuple[str, ...], str] = {
    ("bash", "e2e/demo.sh"): "runs a control plane and replicas until Ctrl-C: tests/chart/test_demo.py",
    ("bash", "tests/run.sh"): "is the whole test run",
    ("docker", "build"): "builds the image: tests/image",
    ("docker", "push"): "pushes to a registry",
    ("pip", "install"): "installs the package these tests run from",
    ("python", "bench/bench_claims.py"): "a benchmark of minutes against every store",
    ("python3", "e2e/controlplane/controlplane.py"): "starts a control plane in the background",
    ("python3", "crds/generate.py"): "needs the control plane: tests/kube/job/test_podspec_schema.py runs it (--check)",
    ("anarchon", "operator"): "runs a replica until stopped: tests/operator start replicas so",
    ("anarchon", "ui"): "serves a page until stopped: tests/ui run it against a live installation in a browser",
    ("helm", "test"): LIVE,
    ("kubectl", "get"): LIVE,
    ("kubectl", "rollout"): LIVE,
    ("kubectl", "auth"): LIVE,
    ("kubectl", "create"): "changes the cluster (a namespace, a Secret) before an install",
    **{("anarchon", verb): LIVE for verb in LIVE_VERBS},
}
#: Commands run here, by their first words (anything else is never run: see the module).
RUN = {
    ("anarchon", "lint"),
    ("anarchon", "next"),
    ("kubectl", "apply"),
    ("kubectl", "explain"),
    ("helm", "install"),
    ("helm", "upgrade"),
    ("helm", "template"),
}
#: Flags of ``helm install`` / ``upgrade`` that ``helm template`` does not take, or that need a release.
INSTALL_ONLY = {"--create-namespace", "--reuse-values", "--wait", "--atomic"}


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    words: tuple[str, ...]
    shown: str | None  # the output a console block shows; None in a bash or sh block

    @property
    def key(self) -> tuple[str, ...]:
        """The program and its verb (kubectl's ``-n NS`` before the verb skipped)."""
        words = list(self.words)
        if words[:1] == ["kubectl"]:
            while len(words) > 2 and words[1] in ("-n", "--namespace"):
                del words[1:3]
        return tuple(words[:2])


def _split(line: str) -> list[list[str]]:
    """A shell line's simple commands (``a && b``, ``a; b``, ``a &``), comments and ``VAR=x`` prefixes left out."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if token in ("&&", ";", "&", "||", "|"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    commands.append(words)
    return [[w for i, w in enumerate(c) if not (re.match(r"^[A-Z_]+=", w) and i == 0)] for c in commands if c]


def blocks(path: Path) -> list[list[Command]]:
    """The shell blocks of a Markdown file, each as its commands in order."""
    found: list[list[Command]] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence.group(1) in SHELLS:
            body = list(enumerate(lines[i + 1 : end], start=i + 2))
            found.append(_console(path, body) if fence.group(1) == "console" else _script(path, body))
        i = end + 1
    return [b for b in found if b]


def _script(path: Path, body: list[tuple[int, str]]) -> list[Command]:
    commands, text, start = [], "", 0
    for number, line in body:
        if not text:
            start = number
        text += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        for words in _split(text):
            commands.append(Command(f"{path.name}:{start}", tuple(words), None))
        text = ""
    return commands


def _console(path: Path, body: list[tuple[int, str]]) -> list[Command]:
    commands: list[Command] = []
    for k, (number, line) in enumerate(body):
        if not line.startswith("$ "):
            continue
        shown = []
        for _, out in body[k + 1 :]:
            if out.startswith("$ "):
                break
            shown.append(out)
        for words in _split(line[2:]):
            commands.append(Command(f"{path.name}:{number}", tuple(words), "\n".join(shown)))
    return commands


ALL = [b for path in DOCS for b in blocks(path)]


def _runnable(block: list[Command]) -> bool:
    return any(c.key in RUN for c in block)


def test_every_command_is_run_or_excluded() -> None:
    unknown = [
        f"{c.where}: {shlex.join(c.words)}"
        for block in ALL
        for c in block
        if c.key not in EXCLUDED and c.key not in RUN and c.words[0] != "cat"
    ]
    assert not unknown, "run these in tests/chart/test_docs.py, or exclude them there with a reason:\n" + "\n".join(
        unknown
    )
    assert sum(_runnable(b) for b in ALL) >= 5, "the docs' runnable commands were not found"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory where the docs' relative paths work (the repository's entries linked in) and
    the files they show with ``cat`` can be written."""
    for entry in REPO.iterdir():
        if not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


@pytest.mark.parametrize("block", [b for b in ALL if _runnable(b)], ids=lambda b: b[0].where)
def test_the_docs_commands_run_as_shown(
    block: list[Command], workdir: Path, crds_installed: ControlPlane, namespace: str
) -> None:
    for command in block:
        if command.words[0] == "cat" and command.shown is not None:
            (workdir / command.words[1]).write_text(command.shown + "\n")
        if command.key not in RUN:
            continue  # excluded, or unknown (test_every_command_is_run_or_excluded says so)
        res = _run(command, workdir, crds_installed, namespace)
        said = (res.stdout + res.stderr).rstrip("\n")
        if command.shown is not None:
            assert said == command.shown, f"{command.where}: {shlex.join(command.words)} says:\n{said}"
        else:
            assert res.returncode == 0, f"{command.where}: {shlex.join(command.words)} exited {res.returncode}:\n{said}"


def _run(command: Command, cwd: Path, crds_installed: ControlPlane, namespace: str) -> subprocess.CompletedProcess[str]:
    words = list(command.words)
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator"), "KUBECONFIG": str(crds_installed.kubeconfig)}
    if words[0] == "anarchon":
        words = [sys.executable, "-m", "anarchon", *words[1:]]
    elif words[0] == "helm":
        words = [str(tool("helm")), "template", *(w for w in words[2:] if w not in INSTALL_ONLY)]
    elif command.key == ("kubectl", "apply"):
        scoped = any(w in ("-n", "--namespace") or w.startswith("--namespace=") for w in words)
        words = [*words, "--dry-run=server", *([] if scoped else ["-n", namespace])]
    return subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
