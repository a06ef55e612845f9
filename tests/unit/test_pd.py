"""PD pieces without processes: the final-turn claim and the launcher's command lines."""

from __future__ import annotations

import pytest
from sglang.srt.managers.io_struct import GenerateReqInput

from s2l_sglang.pd.final import PendingFinal, RouterFinal
from s2l_sglang.pd.serve import PdPorts, instance_argv, router_argv


def test_claim_turns_the_router_copy_into_the_session_turn_once():
    router = RouterFinal("http://127.0.0.1:1")
    router.pending["q::s2l-final"] = PendingFinal([7, 8], {"id": "q", "replace": True, "offset": 3})
    copy = GenerateReqInput(input_ids=[1, 2, 3, 7, 8], rid="q::s2l-final", bootstrap_room=5)
    assert router.claim(copy) is router.pending["q::s2l-final"]
    assert copy.input_ids == [7, 8] and copy.session_params["offset"] == 3
    assert copy.bootstrap_room == 5  # the router's pairing is kept
    again = GenerateReqInput(input_ids=[1, 2, 3, 7, 8], rid="q::s2l-final")
    assert router.claim(again) is None and again.input_ids == [1, 2, 3, 7, 8]
    other = GenerateReqInput(input_ids=[1], rid="other::s2l-final")
    assert router.claim(other) is None and other.session_params is None


def test_launcher_command_lines():
    ports = PdPorts.from_base(40000)
    prefill = instance_argv("prefill", "127.0.0.1", ports, ["--dtype", "float32"])
    assert prefill[-2:] == ["--dtype", "float32"]
    assert "prefill" in prefill and str(ports.bootstrap) in prefill and "40001" in prefill
    # the prefill instance's final turns go through the router (our flag, not the environment)
    assert prefill[prefill.index("--stream-pd-router") + 1] == "http://127.0.0.1:40000"
    decode = instance_argv("decode", "127.0.0.1", ports, [])
    assert "decode" in decode and "--disaggregation-bootstrap-port" not in decode
    # the decode instance finds a stream command's prefill instance in the router's workers
    assert decode[decode.index("--stream-pd-router") + 1] == "http://127.0.0.1:40000"
    assert "mooncake_tcp" in prefill and "mooncake_tcp" in decode
    router = router_argv("127.0.0.1", ports)
    assert router[router.index("--prefill") + 1 : router.index("--prefill") + 3] == [
        "http://127.0.0.1:40001",
        "40003",
    ]
    assert router[router.index("--decode") + 1] == "http://127.0.0.1:40002"
    # a stream's commands and final turn stay on one prefill instance: its id is the key
    assert router[router.index("--prefill-policy") + 1] == "manual"
    assert "--disable-retries" in router  # commands are not idempotent
    assert "--disable-circuit-breaker" in router  # a dead prefill's streams trip decode's


def test_two_prefill_instances_get_their_own_ports():
    ports = PdPorts.from_base(40000, prefills=2)
    assert ports.prefills == [(40001, 40003), (40005, 40006)]
    used = [ports.router, ports.decode, ports.metrics] + [
        p for pair in ports.prefills for p in pair
    ]
    assert len(set(used)) == len(used) and max(used) == 40006  # a block of 2N+3 ports
    second = instance_argv("prefill", "127.0.0.1", ports, [], index=1)
    assert second[second.index("--port") + 1] == "40005"
    assert second[second.index("--disaggregation-bootstrap-port") + 1] == "40006"
    router = router_argv("127.0.0.1", ports)
    starts = [i for i, arg in enumerate(router) if arg == "--prefill"]
    assert [router[i + 1 : i + 3] for i in starts] == [
        ["http://127.0.0.1:40001", "40003"],
        ["http://127.0.0.1:40005", "40006"],
    ]


def test_the_relay_reads_prefill_instances_from_the_router_worker_list():
    """The shape of sglang-router 0.3.2's GET /workers (trimmed from a live PD router)."""
    from s2l_sglang.pd.relay import prefill_urls, via_pd_router

    listing = {
        "workers": [
            {"url": "http://127.0.0.1:31501", "worker_type": "prefill", "bootstrap_port": 31503},
            {"url": "http://127.0.0.1:31505/", "worker_type": "prefill", "bootstrap_port": 31506},
            {"url": "http://127.0.0.1:31502", "worker_type": "decode", "bootstrap_port": None},
        ],
        "total": 3,
    }
    assert prefill_urls(listing) == {
        ("127.0.0.1", 31503): "http://127.0.0.1:31501",
        ("127.0.0.1", 31506): "http://127.0.0.1:31505",
    }
    assert prefill_urls({"error": "x"}) == {} and prefill_urls([]) == {}
    command = {"session_params": {"s2l": {"op": "status", "stream_id": "q"}}}
    assert not via_pd_router(command)  # sent to the instance directly: it runs there
    routed = {**command, "bootstrap_host": "127.0.0.1", "bootstrap_port": 31503}
    assert via_pd_router({**routed, "bootstrap_room": 7})
    assert not via_pd_router(routed)


def test_the_client_reads_our_error_inside_a_pd_router_error_event():
    """sglang-router in PD mode answers a decode error to a `"stream": true` request with
    `data: {'error': {"message": BODY, "status": N}}` and the decode's status."""
    from frontend.errors import UnknownStream, error_from_response

    ours = b'{"error":{"code":"unknown_stream","message":"unknown stream \'q\'","stream_id":"q"}}'
    event = b"data: {'error': {\"message\":" + ours + b',"status":404}}'
    err = error_from_response(404, event)
    assert isinstance(err, UnknownStream) and err.status == 404 and err.stream_id == "q"
    cut = error_from_response(404, event[:60])  # not one: kept as the message
    assert type(cut).__name__ == "StreamAPIError" and cut.code == "http_404"


def test_missing_prerequisites_fail_at_once_naming_make_pd_deps(monkeypatch, capsys):
    """`s2l serve --pd` installs nothing: a missing piece stops it (exit 2) before any process."""
    from s2l_sglang.pd import serve as pd_serve

    monkeypatch.setitem(pd_serve.PYPI, "s2l_no_such_module", "s2l-no-such-package==1.0")
    monkeypatch.setitem(pd_serve.DEBIAN_LIBS, "libs2l-no-such.so.0", "libs2l-no-such0")
    with pytest.raises(pd_serve.PdSetupError, match="make pd-deps") as info:
        pd_serve.check_prerequisites()
    assert "s2l-no-such-package==1.0" in str(info.value) and "libs2l-no-such0" in str(info.value)

    def started(*args, **kwargs):
        raise AssertionError(f"nothing may run or be installed: {args}")

    monkeypatch.setattr(pd_serve.subprocess, "run", started)
    monkeypatch.setattr(pd_serve.subprocess, "Popen", started)
    assert pd_serve.serve(["--port", "40000"]) == 2
    assert "make pd-deps" in capsys.readouterr().err


def test_plugin_lists_the_pd_hooks():
    from s2l_sglang import pd, plugin

    targets = {target for target, _, _ in plugin.hooks()}
    assert {target for target, _, _ in pd.stream_hooks()} <= targets


def test_the_relay_answers_a_typed_error_when_it_cannot_find_the_prefill_instance():
    """A router that does not answer, no router configured, a port that is not a number: each
    a typed error (the middleware answers it in our shape), never an untyped exception (a 500)."""
    import asyncio

    from s2l_sglang.pd.relay import BadBootstrap, NoRouter, PrefillRelay, PrefillUnknown

    async def run():
        relay = PrefillRelay("http://127.0.0.1:1")  # nothing listens on port 1
        try:
            with pytest.raises(PrefillUnknown, match="unreadable"):
                await relay.prefill_url("127.0.0.1", 31503, "q")
            relay.urls = {("127.0.0.1", 31503): "http://127.0.0.1:31501"}
            assert await relay.prefill_url("127.0.0.1", 31503, "q") == "http://127.0.0.1:31501"
            relay.router_url = ""  # a decode instance started without --stream-pd-router
            with pytest.raises(NoRouter, match="--stream-pd-router"):
                await relay.prefill_url("127.0.0.1", 9, "q")
            body = {"session_params": {"s2l": {"stream_id": "q"}}, "bootstrap_port": "x"}
            with pytest.raises(BadBootstrap):
                await relay.relay({**body, "bootstrap_room": 1}, {})
        finally:
            await relay.close()

    asyncio.run(run())
