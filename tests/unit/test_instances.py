"""`s2l serve --instances N` without processes: core shares, command lines, refusals; and the
recognition of stream commands in `/generate` bodies (server/routed.py)."""

from __future__ import annotations

import orjson
import pytest

from s2l_sglang.instances import InstanceSet, cpu_groups, router_argv
from s2l_sglang.server.routed import command_of


def test_each_instance_gets_its_own_share_of_the_cores():
    assert cpu_groups([0, 1], 2) == ["0", "1"]
    assert cpu_groups([3, 0, 1, 2], 2) == ["0-1", "2-3"]
    assert cpu_groups(list(range(5)), 2) == ["0-2", "3-4"]
    assert cpu_groups([0, 2, 4, 6], 2) == ["0,2", "4,6"]
    assert cpu_groups([0], 3) == ["0", "0", "0"]  # fewer cores than instances: shared


def test_command_lines_route_by_stream_id_to_the_fewest_keys():
    argv = router_argv(
        "127.0.0.1", 40000, ["http://127.0.0.1:40001", "http://127.0.0.1:40002"], 40003
    )
    assert argv[argv.index("--policy") + 1] == "manual"
    assert argv[argv.index("--assignment-mode") + 1] == "min_group"
    assert argv[argv.index("--prometheus-port") + 1] == "40003"  # not the shared default 29000
    urls = argv[argv.index("--worker-urls") + 1 : argv.index("--host")]
    assert urls == ["http://127.0.0.1:40001", "http://127.0.0.1:40002"]
    instances = InstanceSet(2, 40000, user_argv=["--dtype", "float32"])
    assert instances.instance_urls == urls
    second = instances.instance_argv(1)
    assert second[second.index("--port") + 1] == "40002" and second[-2:] == ["--dtype", "float32"]
    assert "--instances" not in second


def test_bad_instance_counts_and_a_missing_router_stop_at_once(monkeypatch, capsys):
    from s2l_sglang import instances, procs

    def started(*args, **kwargs):
        raise AssertionError(f"nothing may start: {args}")

    monkeypatch.setattr(procs.subprocess, "Popen", started)  # where a set starts them
    assert instances.serve(["--instances", "zero"]) == 2
    assert "positive integer" in capsys.readouterr().err
    monkeypatch.setattr(instances.importlib.util, "find_spec", lambda name: None)
    assert instances.serve(["--instances", "2"]) == 2
    assert "make pd-deps" in capsys.readouterr().err


@pytest.mark.parametrize(
    "body, is_command",
    [
        ({"session_params": {"s2l": {"op": "open", "stream_id": "a"}}}, True),
        ({"session_params": {"s2l": "not an object"}}, True),  # refused with a 400 later
        ({"text": 'a text with "s2l" in it', "sampling_params": {}}, False),
        ({"text": "x", "session_params": {"id": "s2l"}}, False),
        ({"text": "x", "s2l": {"op": "open"}}, False),  # top level: the router drops it
        (["s2l"], False),
    ],
)
def test_only_session_params_s2l_makes_a_generate_request_a_stream_command(body, is_command):
    assert (command_of(orjson.dumps(body)) is not None) is is_command
    assert command_of(b'{"session_params": {"s2l": ') is None  # malformed: SGLang's to answer
