"""The HTTP server process's stream manager (one per server process, built on first use)."""

from __future__ import annotations

_manager = None


def stream_manager():
    """The server process's StreamManager (built on first use over SGLang's tokenizer manager,
    with the `StreamConfig` that `s2l serve` attached to SGLang's arguments)."""
    global _manager
    if _manager is None:
        from sglang.srt.entrypoints.http_server import get_global_state

        from s2l_sglang.config import of_server_args
        from s2l_sglang.stream.manager import StreamManager

        tm = get_global_state().tokenizer_manager
        config = of_server_args(tm.server_args)
        _manager = StreamManager(tm, config, page_size=tm.server_args.page_size or 1)
        if tm.server_args.disaggregation_mode == "prefill":  # final turns via the PD router
            from s2l_sglang.pd import final as pd_final

            router = pd_final.activate(config.pd_router)
            _manager.final_outputs = router.outputs
    return _manager


def disaggregation_mode() -> str:
    """This server's PD role: "prefill", "decode" or "null" (no disaggregation)."""
    from sglang.srt.entrypoints.http_server import get_global_state

    return str(get_global_state().tokenizer_manager.server_args.disaggregation_mode)


def pd_router_url() -> str | None:
    """The router named by `--stream-pd-router` (or `s2l serve --pd`), read without building
    the stream manager (a decode instance runs no streams)."""
    from sglang.srt.entrypoints.http_server import get_global_state

    from s2l_sglang.config import of_server_args

    return of_server_args(get_global_state().tokenizer_manager.server_args).pd_router
