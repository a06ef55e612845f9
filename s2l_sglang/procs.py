"""The processes of a deployment on one host (`s2l serve --pd`, `s2l serve --instances N`):
started each in its own process group, waited on until healthy, stopped together; and the
reading of the command-line options they are started with."""

from __future__ import annotations

import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


def healthy(url: str, headers: Mapping[str, str] | None = None) -> bool:
    """`url` answers 200: an instance's /health, the router's /readiness (workers registered);
    `headers`: sent with the request (a server's API key). Anything else is not healthy: no
    answer, an error status, or an answer that is not HTTP (a poll of a port nothing listens
    on yet can connect to itself and read its own request)."""
    try:
        request = urllib.request.Request(url, headers=dict(headers or {}))
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status == 200
    except (OSError, http.client.HTTPException):  # URLError is an OSError
        return False


def wait_for(
    proc: subprocess.Popen,
    url: str,
    timeout_s: float | None = None,
    headers: Mapping[str, str] | None = None,
    label: str = "s2l serve",
) -> None:
    """Poll `url` about once a second until it answers 200 (`healthy`, with `headers`): a
    RuntimeError if `proc` exits first, a TimeoutError after `timeout_s` (None: no limit)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not healthy(url, headers):
        if proc.poll() is not None:
            raise RuntimeError(f"{label} exited with {proc.returncode}")
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{label} did not become healthy in {timeout_s:g} s")
        time.sleep(1)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux; its default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(n: int, host: str = "127.0.0.1") -> int:
    """A base port with `n` consecutive ports free on `host`, all below the ephemeral range: a
    port in it can be taken by any outgoing connection (the health polls included) before the
    server that is to listen there binds it."""
    low, _ = _ephemeral_range()
    top = low - n
    if top <= 10000:
        raise RuntimeError(f"no room for {n} ports below the ephemeral range ({low})")
    for _ in range(200):
        base = random.randrange(10000, top)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no block of {n} free ports on {host}")


@dataclass(kw_only=True)
class ProcessSet:
    """Named processes (`procs`: role -> process) of one deployment on `host`, started with the
    user's `user_argv` and the extra environment `env`; `label` names it in errors."""

    label = "deployment"
    host: str = "127.0.0.1"
    user_argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every process
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def spawn(self, role: str, argv: list[str], env: dict[str, str]) -> None:
        self.procs[role] = subprocess.Popen(argv, env=env, start_new_session=True)

    def wait_healthy(self, urls: dict[str, str], timeout_s: float) -> None:
        """Wait until each role's URL answers 200; raise if its process exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        waiting = dict(urls)
        while waiting:
            for role, url in list(waiting.items()):
                if self.procs[role].poll() is not None:
                    raise RuntimeError(
                        f"{self.label} {role} exited with {self.procs[role].returncode}"
                    )
                if healthy(url):
                    del waiting[role]
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"{self.label} {sorted(waiting)} not healthy in {timeout_s:g} s")
            if waiting:
                time.sleep(1)

    def exited(self) -> str | None:
        """The role of a process that has exited, if any."""
        return next((role for role, p in self.procs.items() if p.poll() is not None), None)

    def kill(self, role: str) -> None:
        """Kill one process and its children at once (SIGKILL), as a crash would."""
        proc = self.procs[role]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def option_value(argv: list[str], name: str, default: str | None = None) -> str | None:
    """The value of `name VALUE` / `name=VALUE` in argv (its first), or `default`."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def has_option(argv: list[str], name: str) -> bool:
    """Whether argv has `name` (as `name`, `name VALUE` or `name=VALUE`)."""
    return any(a == name or a.startswith(name + "=") for a in argv)


def take_option(argv: list[str], name: str, default: str) -> tuple[str, list[str]]:
    """Remove `name VALUE` / `name=VALUE` from argv; return the value and the rest."""
    rest, value, it = [], default, iter(argv)
    for arg in it:
        key, eq, val = arg.partition("=")
        if key == name:
            value = val if eq else next(it, default)
        else:
            rest.append(arg)
    return value, rest


def run_until_exit(procs: ProcessSet, start: Callable[[], None], ready: str, command: str) -> int:
    """`s2l serve`'s loop for a set: start it, print `ready`, serve until a process exits
    (1) or the command is interrupted (0); stop everything on the way out."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        start()
        print(ready, file=sys.stderr, flush=True)
        while (role := procs.exited()) is None:
            time.sleep(1)
        print(f"{command}: the {role} process exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        procs.stop()
