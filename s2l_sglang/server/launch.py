"""`s2l serve`: SGLang's HTTP server, launched in this process with our config attached.

What `python -m sglang.launch_server ARGV` does (load the plugins, parse SGLang's arguments,
run the server, kill the children at exit), plus one step: our `StreamConfig` is attached to
the parsed `ServerArgs`, so that it reaches the scheduler and the stream routes with SGLang's own
arguments (config.py).
"""

from __future__ import annotations

import os

from s2l_sglang.config import StreamConfig, attach, with_measured_chunk


def launch_server(sglang_argv: list[str], config: StreamConfig) -> int:
    """Serve until the server stops; `sglang_argv` are `sglang.launch_server` arguments."""
    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(sglang_argv)
    config = with_measured_chunk(config, server_args)
    attach(server_args, config)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    return 0
