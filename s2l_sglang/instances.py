"""`s2l serve --instances N`: N instances behind sglang-router on one host (docs/router.md).

    router      :PORT       sglang-router, policy `manual` (assignment `min_group`): the one
                            address for plain requests and stream commands
    instance i  :PORT+1+i   `s2l serve` with the user's arguments (i = 0 .. N-1)
    (the router's Prometheus metrics on PORT+N+1)

Stream commands reach the instances as `/generate` requests (server/routed.py), the stream id
as the router's routing key: the router places a new key on the instance with the fewest keys
that have requests in flight (`min_group`; ties at random, so streams opened one at a time on an
idle set land at random) and sends every later request of that key there. Plain requests without a key are spread by
the router (at random under `manual`). On a CPU host each instance gets its own share of this
process's cores (SGLANG_CPU_OMP_THREADS_BIND), unless that variable is set; with GPUs, instance
i starts at GPU i x tp (`--base-gpu-id`), unless that is given.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import cached_property

from s2l_sglang.procs import ProcessSet, has_option, option_value, run_until_exit, take_option

ROUTER_PIN = "sglang-router==0.3.2"  # requirements-cpu.txt; `make pd-deps` installs it


def cpu_groups(cores: list[int], n: int) -> list[str]:
    """`cores` split into `n` contiguous shares, each as SGLANG_CPU_OMP_THREADS_BIND writes one
    ("0-3", or "5" for one core); with fewer cores than instances, instances share cores."""
    cores = sorted(cores)
    if len(cores) < n:
        return [str(cores[i % len(cores)]) for i in range(n)]
    size, extra = divmod(len(cores), n)
    groups, start = [], 0
    for i in range(n):
        share = cores[start : start + size + (1 if i < extra else 0)]
        start += len(share)
        contiguous = share[-1] - share[0] == len(share) - 1
        if len(share) == 1:
            groups.append(str(share[0]))
        elif contiguous:
            groups.append(f"{share[0]}-{share[-1]}")
        else:
            groups.append(",".join(map(str, share)))
    return groups


def router_argv(host: str, port: int, worker_urls: list[str], metrics_port: int) -> list[str]:
    return [
        sys.executable, "-m", "sglang_router.launch_router",
        "--worker-urls", *worker_urls, "--host", host, "--port", str(port),
        "--policy", "manual", "--assignment-mode", "min_group",
        "--prometheus-port", str(metrics_port), "--log-level", "warn",
        # a dead instance (connection refused) is out of the set within ~15 s (default: 60 s x
        # 3 checks); a busy one on a loaded CPU may take seconds to answer /health: 30 s allowed
        "--health-check-interval-secs", "5", "--health-check-timeout-secs", "30",
        # a circuit opened on a live instance would move its streams' keys elsewhere (they break)
        "--disable-circuit-breaker",
        # a stream command is not idempotent: a retried append would be appended twice
        "--disable-retries",
    ]  # fmt: skip


@dataclass
class InstanceSet(ProcessSet):
    """N `s2l serve` instances and sglang-router in front of them, each in its own process group."""

    label = "instance set"

    count: int
    port: int  # the router's; instance i on port + 1 + i, the router's metrics on port + count + 1

    @cached_property
    def on_cpu(self) -> bool:
        """No GPU here (asked once: it imports torch)."""
        from s2l_sglang.defaults import is_cpu_host

        return is_cpu_host()

    @property
    def router_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def instance_urls(self) -> list[str]:
        return [f"http://{self.host}:{self.port + 1 + i}" for i in range(self.count)]

    def instance_argv(self, i: int) -> list[str]:
        argv = [sys.executable, "-m", "s2l_sglang.cli", "serve", "--host", self.host]
        argv += ["--port", str(self.port + 1 + i)]
        if not self.on_cpu and not has_option(self.user_argv, "--base-gpu-id"):
            tp = option_value(self.user_argv, "--tp-size") or option_value(self.user_argv, "--tp")
            argv += ["--base-gpu-id", str(i * int(tp or 1))]
        return argv + self.user_argv

    def instance_env(self, i: int) -> dict[str, str]:
        env = dict(os.environ, **self.env)
        if self.on_cpu and not env.get("SGLANG_CPU_OMP_THREADS_BIND"):
            env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_groups(
                list(os.sched_getaffinity(0)), self.count
            )[i]
        return env

    def start(self, timeout_s: float = 900.0) -> InstanceSet:
        """Start the instances, then the router once all are healthy; wait for it."""
        check_router()
        for i in range(self.count):
            self.spawn(f"instance {i}", self.instance_argv(i), self.instance_env(i))
        try:
            health = {f"instance {i}": f"{u}/health" for i, u in enumerate(self.instance_urls)}
            self.wait_healthy(health, timeout_s)
            argv = router_argv(self.host, self.port, self.instance_urls, self.port + self.count + 1)
            self.spawn("router", argv, dict(os.environ, **self.env))
            self.wait_healthy({"router": f"{self.router_url}/readiness"}, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self


class RouterMissing(RuntimeError):
    """sglang-router is not installed (`make pd-deps` installs it)."""


def check_router() -> None:
    if importlib.util.find_spec("sglang_router") is None:
        raise RouterMissing(
            f"`s2l serve --instances` needs {ROUTER_PIN}; install it with `make pd-deps` in the "
            "repository (docs/router.md)"
        )


def serve(argv: list[str]) -> int:
    """`s2l serve --instances N [--host H] [--port P] [ARGS...]`: run the set until interrupted."""
    count, argv = take_option(argv, "--instances", "2")
    host, argv = take_option(argv, "--host", "127.0.0.1")
    port, argv = take_option(argv, "--port", "30000")
    if not count.isdigit() or int(count) < 1:
        print(f"s2l serve: --instances needs a positive integer, not {count!r}", file=sys.stderr)
        return 2
    try:
        check_router()
    except RouterMissing as exc:
        print(f"s2l serve --instances: {exc}", file=sys.stderr)
        return 2
    from s2l_sglang.profile import ensure_profile_before_instances

    ensure_profile_before_instances(argv)
    instances = InstanceSet(int(count), int(port), host=host, user_argv=argv)
    ready = (
        f"{count} instances ready behind sglang-router at {instances.router_url} (plain requests "
        f"and stream commands, docs/router.md); instances {', '.join(instances.instance_urls)}"
    )
    return run_until_exit(instances, instances.start, ready, "s2l serve --instances")


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
