"""The machine a benchmark ran on: CPUs, GPU, load, versions, the code's commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.harness.presets import REPO_ROOT


def _sh(cmd: str) -> str:
    try:
        return subprocess.run(
            cmd, shell=True, capture_output=True, text=True, timeout=10, cwd=REPO_ROOT
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> dict[str, Any]:
    """nproc, CPU model, GPU, load average, versions and the git commit (dirty or not)."""
    info: dict[str, Any] = {
        "nproc": _sh("nproc") or os.cpu_count(),
        "cpu_model": _sh("lscpu | grep 'Model name' | sed 's/.*: *//'") or platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_start": load_now(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    try:
        from importlib.metadata import version

        info["sglang"] = version("sglang")
    except Exception:
        info["sglang"] = "?"
    commit = _sh("git rev-parse --short HEAD")
    dirty = bool(_sh("git status --porcelain --untracked-files=no"))
    info["git"] = f"{commit}{' + uncommitted changes' if dirty else ''}" if commit else "?"
    return info


def load_now() -> str:
    """1/5/15-minute load averages, and the share of time tasks waited for a CPU (Linux PSI)."""
    try:
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"
    try:
        some = Path("/proc/pressure/cpu").read_text().split("\n")[0].split()
        psi = dict(kv.split("=") for kv in some[1:])
        return f"{load} (CPU pressure avg60 {psi['avg60']}%, avg300 {psi['avg300']}%)"
    except (OSError, ValueError, KeyError, IndexError):
        return load
