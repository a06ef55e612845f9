"""Read any trace file the benchmark replays (`s2l bench --traces FILE [FILE ...]`).

Formats, by what the path is:

- `*.jsonl`, `*.jsonl.xz`, `*.jsonl.gz` (or `.json` lines): the normalized format
  (`bench.traces`), one trace per line;
- `*.csv` with the artifact's crawler columns (type, query, content, startTime, endTime): one
  or more crawler queries (`bench.artifact.load_crawler_csv`);
- `*.csv` with the artifact's ANN pipeline columns (StartTime_us, EndTime_us, StartIteration,
  EndIteration, PipelinePool): one ANN query; its query map (`query_trace_map.json`) and corpus
  (`retrieved_corpus_content*.json`) are looked up in the CSV's folder and the one above it
  (the artifact's data/anns layout: the CSVs under res/);
- a folder: the artifact's crawler folder (`query_*.csv`) or ANN folder (`query_trace_map.json`,
  corpus parts, the CSVs in `res/` or beside the map).

Every error is a `TraceFileError` naming the file and, where it has one, the line.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from bench.artifact import ANN_COLUMNS, CRAWLER_COLUMNS, load_ann_pipeline, load_crawler_csv
from bench.traces import Trace, TraceFileError, read_traces

QUERY_MAP = "query_trace_map.json"
CORPUS_GLOB = "retrieved_corpus_content*.json"
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def read_any(path: str | Path) -> list[Trace]:
    """The traces in `path` (a file or folder of any format above): at least one, ids unique."""
    path = Path(path)
    if not path.exists():
        raise TraceFileError(path, None, "no such file or folder")
    if path.is_dir():
        traces = _folder(path)
    elif path.suffix == ".csv":
        traces = _csv(path)
    elif _is_jsonl(path):
        traces = read_traces(path)
    else:
        raise TraceFileError(
            path, None, "unknown format: expected .jsonl[.xz|.gz], an artifact .csv or a folder"
        )
    if not traces:
        raise TraceFileError(path, None, "no traces in it")
    seen: set[str] = set()
    for trace in traces:  # (a JSON-lines file was checked line by line)
        if trace.id in seen:
            raise TraceFileError(path, None, f"duplicate trace id {trace.id!r}")
        seen.add(trace.id)
    return traces


def workload_name(path: str | Path, taken: Sequence[str] = ()) -> str:
    """A workload name for a trace file: its stem (traces.jsonl.xz -> traces), made unique."""
    name = Path(path).name
    for suffix in (".xz", ".gz", ".csv", *JSONL_SUFFIXES):
        name = name.removesuffix(suffix)
    name = name or "traces"
    unique, k = name, 2
    while unique in taken:
        unique, k = f"{name}-{k}", k + 1
    return unique


def _is_jsonl(path: Path) -> bool:
    suffixes = path.suffixes
    if suffixes and suffixes[-1] in (".xz", ".gz"):
        suffixes = suffixes[:-1]
    return bool(suffixes) and suffixes[-1] in JSONL_SUFFIXES


def _header(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceFileError(path, None, f"cannot read: {exc}") from None


def _csv(path: Path) -> list[Trace]:
    # The format with more of its columns in the header; its loader names the missing ones.
    header = set(_header(path))
    crawler, ann = len(header & set(CRAWLER_COLUMNS)), len(header & set(ANN_COLUMNS))
    if crawler >= 2 and crawler >= ann:
        return load_crawler_csv(path)
    if ann >= 2:
        for folder in (path.parent, path.parent.parent):
            if (folder / QUERY_MAP).exists():
                traces = load_ann_pipeline(path, folder / QUERY_MAP, _corpus(folder))
                if not traces:
                    raise TraceFileError(path, None, f"no query in {folder / QUERY_MAP} uses it")
                return traces
        raise TraceFileError(path, None, f"an ANN pipeline CSV needs {QUERY_MAP} beside it")
    raise TraceFileError(
        path,
        1,
        f"unknown CSV columns; expected the crawler's ({', '.join(CRAWLER_COLUMNS)}) or the "
        f"ANN pipeline's ({', '.join(ANN_COLUMNS)})",
    )


def _corpus(folder: Path) -> list[Path]:
    files = sorted(folder.glob(CORPUS_GLOB))
    if not files:
        raise TraceFileError(folder, None, f"no corpus ({CORPUS_GLOB}) beside {QUERY_MAP}")
    return files


def _folder(path: Path) -> list[Trace]:
    if (path / QUERY_MAP).exists():
        res = path / "res" if (path / "res").is_dir() else path
        return load_ann_pipeline(res, path / QUERY_MAP, _corpus(path))
    if any(path.glob("query_*.csv")):
        return load_crawler_csv(path)
    raise TraceFileError(
        path, None, f"a trace folder holds query_*.csv (crawler) or {QUERY_MAP} (ANN)"
    )
