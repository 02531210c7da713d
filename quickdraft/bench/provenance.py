"""Where a benchmark ran: machine, library versions, git commit, command line, dataset checksum."""

import hashlib
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import quickdraft

PACKAGE_ROOT = Path(quickdraft.__file__).resolve().parent.parent


def provenance(dataset: Path, torch_threads: int | None = None) -> dict:
    """A dict to store with results so anyone can tell how and where they were produced. `torch_threads`: what the
    models ran on, where they ran in this process (a load generator for a server runs none); read without importing
    torch, whose versions are the installed ones."""
    return {
        "command_line": shlex.join(["quickdraft", *sys.argv[1:]]) if _run_as_cli() else shlex.join(sys.argv),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": git_state(PACKAGE_ROOT),
        "versions": {
            "python": platform.python_version(),
            "torch": version("torch"),
            "transformers": version("transformers"),
        },
        "machine": machine_info(torch_threads),
        "dataset": {"path": str(dataset), "sha256": hashlib.sha256(Path(dataset).read_bytes()).hexdigest()},
    }


def machine_info(torch_threads: int | None = None) -> dict:
    info = {"platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count()}
    if torch_threads is not None:
        info["torch_threads"] = torch_threads
    return info | {"load_average": list(os.getloadavg())}


def git_state(root: Path) -> dict:
    """Commit and whether the working tree has uncommitted changes (None outside a git checkout)."""
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if commit else None}


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _run_as_cli() -> bool:
    return Path(sys.argv[0]).name in ("quickdraft", "__main__.py")
