"""The health poll and port choice of multi-process deployments (`s2l_sglang.procs`)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from s2l_sglang.procs import _ephemeral_range, free_port_block, healthy, wait_for


def _echo_once(listener: socket.socket) -> None:
    """Answer one connection with its own request line, as a poll that connected to itself does."""
    conn, _ = listener.accept()
    with conn:
        conn.sendall(conn.recv(4096).split(b"\r\n")[0] + b"\r\n\r\n")


def test_an_answer_that_is_not_http_is_not_healthy() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        t = threading.Thread(target=_echo_once, args=(listener,), daemon=True)
        t.start()
        assert healthy(f"http://127.0.0.1:{port}/health") is False
        t.join(timeout=10)


class _Status(BaseHTTPRequestHandler):
    code = 200

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(self.code)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _serve(code: int) -> tuple[HTTPServer, str]:
    handler = type("Handler", (_Status,), {"code": code})
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/health"


def test_200_is_healthy_and_an_error_status_is_not() -> None:
    ok, ok_url = _serve(200)
    bad, bad_url = _serve(503)
    try:
        assert healthy(ok_url) is True
        assert healthy(bad_url) is False
    finally:
        ok.shutdown()
        bad.shutdown()


def test_nothing_listening_is_not_healthy() -> None:
    base = free_port_block(1)
    assert healthy(f"http://127.0.0.1:{base}/health") is False


def test_a_port_block_is_free_and_below_the_ephemeral_range() -> None:
    low, _ = _ephemeral_range()
    for _ in range(20):
        base = free_port_block(7)
        assert base + 7 <= low
        for port in range(base, base + 7):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # raises if taken


def test_a_port_block_skips_a_taken_port() -> None:
    base = free_port_block(3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", base + 1))
        held.listen(1)
        for _ in range(20):
            other = free_port_block(3)
            assert not other <= base + 1 < other + 3


class _KeyRequired(_Status):
    """200 only with the API key's header, as `s2l serve --api-key` answers /health."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        ok = self.headers.get("Authorization") == "Bearer k"
        self.send_response(200 if ok else 401)
        self.end_headers()


def test_wait_for_sends_the_headers_and_returns_once_healthy() -> None:
    server = HTTPServer(("127.0.0.1", 0), _KeyRequired)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert healthy(url) is False  # 401 without the key
        wait_for(proc, url, timeout_s=30, headers={"Authorization": "Bearer k"})
        with pytest.raises(TimeoutError, match="not become healthy in 0 s"):
            wait_for(proc, url, timeout_s=0)  # no key: never healthy
    finally:
        proc.kill()
        proc.wait()
        server.shutdown()


def test_wait_for_fails_when_the_process_exits_first() -> None:
    url = f"http://127.0.0.1:{free_port_block(1)}/health"  # nothing listens
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="s2l serve exited with 3"):
        wait_for(proc, url, timeout_s=60)
