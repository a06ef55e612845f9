"""`s2l serve --pd`: a prefill-decode deployment on one host (prefill, decode, sglang-router).

    router   :PORT      sglang-router in PD mode: /generate and the rest of SGLang's API
    prefill  :PORT+1    `s2l serve --disaggregation-mode prefill` (bootstrap on PORT+3): streams
    decode   :PORT+2    `s2l serve --disaggregation-mode decode`
    (the router's Prometheus metrics on PORT+4)

KV moves from prefill to decode over TCP (Mooncake's `mooncake_tcp` transfer backend, PyPI
`mooncake-transfer-engine-non-cuda`). Nothing is installed here: `check_prerequisites` fails at
once, naming `make pd-deps`, when the two PyPI packages (the `.[pd]` extra, pinned in
requirements-cpu.txt) or the three Debian libraries the Mooncake wheel loads even for TCP are
missing. `make pd-deps` (also run by `make venv`) installs them.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass

from s2l_sglang.procs import ProcessSet, run_until_exit, take_option

PYPI = {  # module -> PyPI pin (the `.[pd]` extra; requirements-cpu.txt)
    "sglang_router": "sglang-router==0.3.2",
    "mooncake": "mooncake-transfer-engine-non-cuda==0.3.13.post1",
}
DEBIAN_LIBS = {  # shared object -> Debian package
    "libibverbs.so.1": "libibverbs1",
    "libnl-3.so.200": "libnl-3-200",
    "libnl-route-3.so.200": "libnl-route-3-200",
}
INSTALL_COMMAND = "make pd-deps"  # the one documented command that installs all of the above
TRANSFER_BACKEND = "mooncake_tcp"


class PdSetupError(RuntimeError):
    """A prerequisite of the PD deployment is missing (`make pd-deps` installs them)."""


def missing_prerequisites() -> list[str]:
    """What the PD deployment lacks, as PyPI pins and Debian packages (empty when all is there)."""
    missing = [pin for module, pin in PYPI.items() if importlib.util.find_spec(module) is None]
    for lib, package in DEBIAN_LIBS.items():
        try:
            ctypes.CDLL(lib)
        except OSError:
            missing.append(f"{package} (Debian, {lib})")
    return missing


def check_prerequisites() -> None:
    """Raise `PdSetupError` at once if a prerequisite is missing; install nothing."""
    missing = missing_prerequisites()
    if missing:
        raise PdSetupError(
            f"the PD deployment needs {', '.join(missing)}; install them with `{INSTALL_COMMAND}` "
            "in the repository (docs/pd.md)"
        )
    probe = [sys.executable, "-c", "import mooncake.engine"]
    done = subprocess.run(probe, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise PdSetupError(f"the Mooncake transfer engine does not load: {done.stderr[-800:]}")


@dataclass(frozen=True)
class PdPorts:
    router: int
    prefill: int
    decode: int
    bootstrap: int
    metrics: int  # the router's Prometheus port (its default, 29000, collides across routers)

    @classmethod
    def from_base(cls, port: int) -> PdPorts:
        return cls(port, prefill=port + 1, decode=port + 2, bootstrap=port + 3, metrics=port + 4)


def instance_argv(role: str, host: str, ports: PdPorts, user_argv: list[str]) -> list[str]:
    """`s2l serve` arguments of the prefill or decode instance (the prefill instance's streams
    send their final turns through the router: `--stream-pd-router`)."""
    port = ports.prefill if role == "prefill" else ports.decode
    argv = [sys.executable, "-m", "s2l_sglang.cli", "serve", "--host", host, "--port", str(port)]
    argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", TRANSFER_BACKEND]
    if role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(ports.bootstrap)]
        argv += ["--stream-pd-router", f"http://{host}:{ports.router}"]
    return argv + user_argv


def router_argv(host: str, ports: PdPorts) -> list[str]:
    return [
        sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
        "--prefill", f"http://{host}:{ports.prefill}", str(ports.bootstrap),
        "--decode", f"http://{host}:{ports.decode}",
        "--host", host, "--port", str(ports.router), "--policy", "round_robin",
        "--prometheus-port", str(ports.metrics), "--log-level", "warn",
    ]  # fmt: skip


@dataclass
class PdSet(ProcessSet):
    """The three processes of a PD deployment on `host` (each in its own process group)."""

    label = "PD"

    ports: PdPorts

    @property
    def router_url(self) -> str:
        return f"http://{self.host}:{self.ports.router}"

    @property
    def prefill_url(self) -> str:
        return f"http://{self.host}:{self.ports.prefill}"

    @property
    def decode_url(self) -> str:
        return f"http://{self.host}:{self.ports.decode}"

    def start(self, timeout_s: float = 900.0) -> PdSet:
        """Start prefill and decode, then the router once both are healthy; wait for it."""
        env = dict(os.environ, **self.env, SGLANG_HOST_IP=self.host)  # Mooncake binds it
        for role in ("prefill", "decode"):
            argv = instance_argv(role, self.host, self.ports, self.user_argv)
            self.spawn(role, argv, env)
        try:
            self.wait_healthy(
                {"prefill": f"{self.prefill_url}/health", "decode": f"{self.decode_url}/health"},
                timeout_s,
            )
            self.spawn("router", router_argv(self.host, self.ports), env)
            self.wait_healthy({"router": f"{self.router_url}/readiness"}, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self


def serve(argv: list[str]) -> int:
    """`s2l serve --pd [--host H] [--port P] [SGLANG_ARGS...]`: run the set until interrupted."""
    host, argv = take_option(argv, "--host", "127.0.0.1")
    port, argv = take_option(argv, "--port", "30000")
    try:
        check_prerequisites()
    except PdSetupError as exc:
        print(f"s2l serve --pd: {exc}", file=sys.stderr)
        return 2
    from s2l_sglang.profile import ensure_profile_before_instances

    ensure_profile_before_instances(argv)
    pd = PdSet(PdPorts.from_base(int(port)), host=host, user_argv=argv)
    ready = (
        f"PD deployment ready: router {pd.router_url} (/generate, ...), streams on the "
        f"prefill instance {pd.prefill_url}/stream/..., decode {pd.decode_url}"
    )
    return run_until_exit(pd, pd.start, ready, "s2l serve --pd")


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
