"""`s2l serve --pd`: a prefill-decode deployment on one host (prefill, decode, sglang-router).

    router   :PORT      sglang-router in PD mode: SGLang's API and the stream commands
                        (`/generate` with `session_params.s2l`, server/routed.py)
    prefill  :PORT+1    `s2l serve --disaggregation-mode prefill` (bootstrap on PORT+3): streams
    decode   :PORT+2    `s2l serve --disaggregation-mode decode`
    (the router's Prometheus metrics on PORT+4; with `--prefill-instances N`, prefill instance
    i > 1 on PORT+2i+1, bootstrap PORT+2i+2)

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
    prefill: int  # the first prefill instance's HTTP port
    decode: int
    bootstrap: int  # the first prefill instance's bootstrap port
    metrics: int  # the router's Prometheus port (its default, 29000, collides across routers)
    #: (HTTP, bootstrap) ports of prefill instances 2..N
    more_prefills: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_base(cls, port: int, prefills: int = 1) -> PdPorts:
        """PORT router, +1 prefill, +2 decode, +3 bootstrap, +4 metrics; prefill instance i > 1
        on PORT+2i+1 with bootstrap PORT+2i+2 (a block of 2N+3 ports)."""
        more = tuple((port + 2 * i + 1, port + 2 * i + 2) for i in range(2, prefills + 1))
        return cls(port, port + 1, port + 2, port + 3, port + 4, more)

    @property
    def prefills(self) -> list[tuple[int, int]]:
        """(HTTP, bootstrap) ports of every prefill instance, the first first."""
        return [(self.prefill, self.bootstrap), *self.more_prefills]


def instance_argv(
    role: str, host: str, ports: PdPorts, user_argv: list[str], index: int = 0
) -> list[str]:
    """`s2l serve` arguments of prefill instance `index` or of the decode instance. Both know
    the router (`--stream-pd-router`): a prefill instance sends its streams' final turns through
    it, the decode instance finds there the prefill instance to relay a stream command to."""
    http, bootstrap = ports.prefills[index] if role == "prefill" else (ports.decode, None)
    argv = [sys.executable, "-m", "s2l_sglang.cli", "serve", "--host", host, "--port", str(http)]
    argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", TRANSFER_BACKEND]
    if bootstrap is not None:
        argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
    argv += ["--stream-pd-router", f"http://{host}:{ports.router}"]
    return argv + user_argv


def router_argv(host: str, ports: PdPorts) -> list[str]:
    """The PD router: the prefill instance of a request by its routing key (the stream id, for a
    stream's commands and final turn; at random for plain requests), decode by round robin."""
    prefills = []
    for http, bootstrap in ports.prefills:
        prefills += ["--prefill", f"http://{host}:{http}", str(bootstrap)]
    return [
        sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
        *prefills, "--decode", f"http://{host}:{ports.decode}",
        "--host", host, "--port", str(ports.router),
        "--prefill-policy", "manual", "--assignment-mode", "min_group",
        "--decode-policy", "round_robin",
        "--prometheus-port", str(ports.metrics), "--log-level", "warn",
        # a stream command is not idempotent: a retried append would be appended twice
        "--disable-retries",
        # the calls of a dead prefill instance's streams fail at the decode worker too (502):
        # a circuit it opens on the one decode worker stops every stream (seen in CI)
        "--disable-circuit-breaker",
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
        return self.prefill_urls[0]

    @property
    def prefill_urls(self) -> list[str]:
        return [f"http://{self.host}:{http}" for http, _ in self.ports.prefills]

    @property
    def decode_url(self) -> str:
        return f"http://{self.host}:{self.ports.decode}"

    def start(self, timeout_s: float = 900.0) -> PdSet:
        """Start prefill and decode, then the router once both are healthy; wait for it."""
        env = dict(os.environ, **self.env, SGLANG_HOST_IP=self.host)  # Mooncake binds it
        health = {}
        for i, url in enumerate(self.prefill_urls):
            role = "prefill" if i == 0 else f"prefill {i + 1}"
            self.spawn(
                role, instance_argv("prefill", self.host, self.ports, self.user_argv, i), env
            )
            health[role] = f"{url}/health"
        self.spawn("decode", instance_argv("decode", self.host, self.ports, self.user_argv), env)
        health["decode"] = f"{self.decode_url}/health"
        try:
            self.wait_healthy(health, timeout_s)
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
    prefills, argv = take_option(argv, "--prefill-instances", "1")
    if not prefills.isdigit() or int(prefills) < 1:
        print(f"s2l serve --pd: --prefill-instances must be >= 1: {prefills!r}", file=sys.stderr)
        return 2
    try:
        check_prerequisites()
    except PdSetupError as exc:
        print(f"s2l serve --pd: {exc}", file=sys.stderr)
        return 2
    from s2l_sglang.profile import ensure_profile_before_instances

    ensure_profile_before_instances(argv)
    pd = PdSet(PdPorts.from_base(int(port), int(prefills)), host=host, user_argv=argv)
    ready = (
        f"PD deployment ready: router {pd.router_url} (plain requests and stream commands, "
        f"docs/pd.md); prefill {', '.join(pd.prefill_urls)}, decode {pd.decode_url}"
    )
    return run_until_exit(pd, pd.start, ready, "s2l serve --pd")


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
