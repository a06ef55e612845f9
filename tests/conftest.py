"""Shared fixtures: a tiny random-weight Llama for unit tests, one real engine per session."""

from __future__ import annotations

import contextlib
import os
import tempfile

import pytest

from tests.helpers import StreamCalls

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests see the profiles shipped with the package only, not the ones `s2l profile` saved on
# this machine (a saved prefill step would change the speculative chunk of every engine and
# server the tests start: `config.with_measured_chunk`); tests that save profiles set their own.
os.environ["S2L_PROFILE_DIR"] = tempfile.mkdtemp(prefix="s2l-test-profiles-")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny random-weight Llama with a BPE tokenizer trained at test time (a folder path)."""
    from tests.helpers import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


_LIVE: dict[str, object] = {}  # the session's engine and server, once started


def _stream_state_now() -> list[tuple[str, dict]]:
    """(which, s2l_sched) of the session's engine and server, if started."""
    import requests

    from s2l_sglang.stream.manager import sched_counters_from

    states = []
    if "engine" in _LIVE:
        states.append(("engine", _LIVE["engine"].sched_counters()))
    if "server" in _LIVE:
        url = _LIVE["server"]
        info = requests.get(
            f"{url}/server_info", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30
        ).json()
        states.append(("server", sched_counters_from(info.get("internal_states")) or {}))
    return states


@pytest.fixture(scope="module", autouse=True)
def no_stream_left_behind():
    """After every test module: no stream holds an SGLang session, a session slot (KV) or a
    host copy on the session's engine or server (waits a bounded time for closes to land)."""
    yield
    import time

    deadline = time.monotonic() + 60
    while True:
        held = {
            which: {k: state.get(k) for k in ("open_sessions", "session_slots", "host_copies")}
            for which, state in _stream_state_now()
        }
        if all(not any(v.values()) for v in held.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"streams left behind after the module: {held}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def engine():
    """The real SGLang engine on CPU (embedded model, float32) with streams, once per session.

    SGLang's strict idle memory check is on: KV that no request, cache node or session holds
    fails the engine. It counts a session's KV as held, so a stream left open (a leaked slot)
    is caught by `no_stream_left_behind`, not by it.
    """
    os.environ["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE"] = "1"
    from s2l_sglang.stream.engine import StreamEngine

    eng = StreamEngine(idle_timeout=3.0, log_level="error", max_total_tokens=16384)
    eng.generate("warm up", {"max_new_tokens": 1})
    _LIVE["engine"] = eng
    yield eng
    _LIVE.pop("engine", None)
    eng.shutdown()


@contextlib.contextmanager
def serving(extra_argv: list[str], timeout_s: float = 300, env: dict | None = None, log=None):
    """`s2l serve` on a free loopback port with `--api-key API_KEY` and `extra_argv`, until the
    block ends (SGLang's strict idle memory check on; `env`: more environment; `log`: a path
    that gets the server's stdout and stderr); yields its URL once healthy."""
    import signal
    import subprocess
    import sys

    from s2l_sglang.procs import free_port_block, wait_for

    port = free_port_block(1)
    argv = [sys.executable, "-m", "s2l_sglang.cli", "serve", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--max-total-tokens", "16384", "--log-level", "error"]
    argv += ["--api-key", API_KEY, *extra_argv]
    env = dict(os.environ, SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1", **(env or {}))
    out = open(log, "ab") if log is not None else None  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, start_new_session=True, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for(proc, f"{url}/health", timeout_s, {"Authorization": f"Bearer {API_KEY}"})
        except RuntimeError as e:
            tail = open(log, errors="replace").read()[-3000:] if log is not None else ""
            raise RuntimeError(f"{e}\n{tail}") from None
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        if out is not None:
            out.close()


API_KEY = "s2l-test-key"


class Server(StreamCalls):
    """The test server: its URL, API key, and the tokens of the streams tests opened on it."""

    def __init__(self, url: str, api_key: str):
        super().__init__(url, {"Authorization": f"Bearer {api_key}"})
        self.api_key = api_key


@pytest.fixture(scope="session")
def server(server_url):
    """The test server's URL and API key (every request needs `headers`)."""
    return Server(server_url, API_KEY)


@pytest.fixture(scope="session")
def server_log(tmp_path_factory):
    """The file that gets the session server's stdout and stderr."""
    return tmp_path_factory.mktemp("server") / "s2l-serve.log"


@pytest.fixture(scope="session")
def server_url(server_log):
    """`s2l serve` (SGLang's HTTP server with the plugin) on a free loopback port, once per session.

    Started with `--api-key API_KEY`, a 3 s stream idle timeout and `--preemption recompute`
    (our flags: tests check that they reach the routes and the scheduler). Its output goes to
    `server_log`.
    """
    extra = ["--stream-idle-timeout", "3", "--preemption", "recompute"]
    with serving(extra, log=server_log) as url:
        _LIVE["server"] = url
        try:
            yield url
        finally:
            _LIVE.pop("server", None)
