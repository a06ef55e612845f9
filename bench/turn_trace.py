"""When each stream's turns ran: `s2l bench` with every engine turn of every stream recorded.

    .venv/bin/python -m bench.turn_trace --trace turns.jsonl -- bench --preset cpu-full ...
    .venv/bin/python -m bench.turn_trace --summary turns.jsonl

The first form runs the `s2l` command after `--` in this process (`s2l bench` with the
in-process engine, where the stream manager lives) with `StreamManager._turn` and
`_set_context` wrapped, and writes one JSON line per event to `--trace`: a new context
(`{"sid", "ctx": tokens, "t"}`) and each turn once it ends (`{"sid", "rid", "final", "keep",
"delta", "t0", "t1", "cached", "ran"}`; `t0` when the manager sent it, `t1` when it ended, on
the monotonic clock; `ran`: SGLang finished it, False for a turn cancelled or carried by the
final turn while still queued). It changes nothing the engine does; the wrapper costs two
clock reads and one line of JSON a turn or context. A diagnosis tool: the harness and its
reports never read the trace.

`--summary` prints, from such a file, the speculative turns that ran and those still queued
when their stream's final turn was sent (the final carried their tokens), with how long those
had waited, and the finals that carried one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import orjson


def record_turns(path: Path) -> Callable[[], None]:
    """Wrap the stream manager's turns and context changes to append events to `path`;
    returns what unwraps them (and closes the file)."""
    from s2l_sglang.rid import is_final
    from s2l_sglang.stream import manager

    out = path.open("ab")
    turn, set_context = manager.StreamManager._turn, manager.StreamManager._set_context

    def write(event: dict) -> None:
        out.write(orjson.dumps(event) + b"\n")
        out.flush()

    async def _turn(self, stream, plan, sampling_params, rid, *args, **kwargs):
        event = {"sid": stream.sid, "rid": rid, "final": is_final(rid), "keep": plan.keep,
                 "delta": len(plan.delta), "t0": time.monotonic()}  # fmt: skip
        try:
            out_ = await turn(self, stream, plan, sampling_params, rid, *args, **kwargs)
            meta = out_.get("meta_info", {}) if isinstance(out_, dict) else {}
            reason = meta.get("finish_reason") or {}
            ran = bool(reason) and reason.get("type") != "abort"  # a cancelled turn: {}
            event.update(cached=meta.get("cached_tokens"), ran=ran)
            return out_
        except BaseException as exc:
            event.update(ran=False, error=type(exc).__name__)
            raise
        finally:
            event["t1"] = time.monotonic()
            write(event)

    async def _set_context(self, stream, ids, *args, **kwargs):
        write({"sid": stream.sid, "ctx": len(ids), "t": time.monotonic()})
        return await set_context(self, stream, ids, *args, **kwargs)

    manager.StreamManager._turn = _turn
    manager.StreamManager._set_context = _set_context

    def restore() -> None:
        manager.StreamManager._turn, manager.StreamManager._set_context = turn, set_context
        out.close()

    return restore


def summary(events: Iterable[dict]) -> dict:
    """Speculative turns that ran, and those still queued at their stream's finish (ended
    without running, after their stream's final turn was sent): how many, and how long those
    had waited (their `t0` to the final turn's); the finals that carried one."""
    turns = [e for e in events if "rid" in e]
    finals = {e["sid"]: e for e in turns if e["final"]}
    spec = [e for e in turns if not e["final"]]
    carried = [
        (e, finals[e["sid"]])
        for e in spec
        if not e.get("ran") and e["sid"] in finals and finals[e["sid"]]["t0"] <= e["t1"]
    ]
    waits = sorted(f["t0"] - e["t0"] for e, f in carried)
    return {
        "speculative_ran": sum(1 for e in spec if e.get("ran")),
        "speculative_tokens_ran": sum(e["delta"] for e in spec if e.get("ran")),
        "carried_by_final": len(carried),
        "carried_tokens": sum(e["delta"] for e, _ in carried),
        "carried_waited_s": {
            "p50": round(statistics.median(waits), 3),
            "max": round(waits[-1], 3),
        }
        if waits
        else None,
        "finals": len(finals),
        "finals_that_carried_one": len({e["sid"] for e, _ in carried}),
    }


def read_events(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--trace", type=Path, help="record into this JSONL file and run `-- s2l ...`"
    )
    parser.add_argument("--summary", type=Path, help="summarize a recorded JSONL file")
    args = parser.parse_args(argv)
    if args.summary:
        print(orjson.dumps(summary(read_events(args.summary)), option=orjson.OPT_INDENT_2).decode())
        return 0
    if not args.trace or not rest:
        parser.error("give --summary FILE, or --trace FILE -- <s2l arguments>")
    record_turns(args.trace)
    from s2l_sglang.cli import main as s2l

    return s2l(rest)


if __name__ == "__main__":
    sys.exit(main())
