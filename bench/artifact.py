"""Readers for the Stream2LLM artifact's trace formats (github rajveerb/stream2llm), giving `Trace`s.

Crawler (append), one CSV per query (`query_<n>.csv`) or several queries in one CSV:
  columns type (tavily_search | page_scrape), query, content, startTime, endTime (seconds).
  As the artifact's replay does (experiments/crawler/replay_query_crawls.py): rows are ordered by
  endTime; each page_scrape row is an append event at its endTime, relative to the query's first
  startTime, with content + "\\n"; the search row's content is not part of the context, its
  endTime is kept as meta["search_end"] (the stream opens then).

ANN search (update): one CSV per query (`<id>_pipeline_trace.csv`) with columns StartTime_us,
  EndTime_us, StartIteration, EndIteration, PipelinePool ("(docid,docid,...)"); a query map JSON
  `{"<query id>": {"query": "<question>", "trace_file": "<csv name>"}, ...}` (the shape the
  artifact's experiments/anns/replay_anns_queries.py reads; extra keys are kept in meta); and a
  corpus JSON `{"<docid>": "<text>", ...}`, possibly split in parts
  (`retrieved_corpus_content.part.<k>.json`). As in the artifact's replay, row i's pool is sent
  after its window: event i is at sum(EndTime_us - StartTime_us for rows 0..i) (that is
  EndTime_i - StartTime_0 for contiguous windows) and its content is the pool's documents in
  order, each followed by "\\n".

A malformed file (missing columns, a time that is not a number, a window that ends before it
starts, JSON that does not parse) raises `bench.traces.TraceFileError` with the file and line.
"""

from __future__ import annotations

import csv
import glob
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.traces import DEFAULT_TEMPLATE, Trace, TraceEvent, TraceFileError

_QUERY_FILE = re.compile(r"query_(\d+)\.csv$")
CRAWLER_COLUMNS = ("type", "query", "content", "startTime", "endTime")
ANN_COLUMNS = ("StartTime_us", "EndTime_us", "StartIteration", "EndIteration", "PipelinePool")
CRAWLER_TYPES = ("tavily_search", "page_scrape")


def read_csv(file: Path, required: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV file whose header has the `required` columns."""
    try:
        with file.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceFileError(file, 1, f"missing column(s) {', '.join(missing)}")
            rows = []
            for row in reader:
                if None in row or any(v is None for v in row.values()):
                    raise TraceFileError(file, reader.line_num, "wrong number of fields")
                rows.append((reader.line_num, row))
            return rows
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceFileError(file, None, f"cannot read: {exc}") from None


def number(file: Path, line: int, row: dict[str, str], column: str) -> float:
    try:
        return float(row[column])
    except ValueError:
        raise TraceFileError(file, line, f"{column} is not a number: {row[column]!r}") from None


def read_json(file: Path) -> Any:
    try:
        return orjson.loads(Path(file).read_bytes())
    except OSError as exc:
        raise TraceFileError(file, None, f"cannot read: {exc}") from None
    except orjson.JSONDecodeError as exc:
        raise TraceFileError(file, exc.lineno, f"not JSON ({exc.msg})") from None


def load_crawler_csv(
    path: str | Path, template: str = DEFAULT_TEMPLATE, workload: str = "crawler-artifact"
) -> list[Trace]:
    """Traces from one artifact crawler CSV, or from every `query_*.csv` in a directory."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("query_*.csv"), key=_query_file_order)
    else:
        files = [path]
    traces: list[Trace] = []
    for file in files:
        traces.extend(_crawler_file(file, template, workload))
    return traces


def _query_file_order(path: Path) -> tuple[int, str]:
    match = _QUERY_FILE.search(path.name)
    return (int(match.group(1)) if match else -1, path.name)


def _crawler_file(file: Path, template: str, workload: str) -> list[Trace]:
    lines = read_csv(file, CRAWLER_COLUMNS)
    for line, row in lines:
        if row["type"] not in CRAWLER_TYPES:
            raise TraceFileError(
                file, line, f"type must be one of {CRAWLER_TYPES}: {row['type']!r}"
            )
        start, end = number(file, line, row, "startTime"), number(file, line, row, "endTime")
        if end < start:
            raise TraceFileError(file, line, "endTime is before startTime")
    rows = [row for _, row in lines]
    # Page rows may leave `query` empty: they belong to the file's (first) searched query.
    file_query = next((r["query"] for r in rows if r.get("query")), "")
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(row.get("query") or file_query, []).append(row)

    traces = []
    for k, (question, group) in enumerate(groups.items()):
        group.sort(key=lambda r: float(r["endTime"]))
        t0 = min(float(r["startTime"]) for r in group)
        pages = [r for r in group if r["type"] == "page_scrape"]
        if not pages:
            continue  # a search that found nothing to scrape streams no context
        searches = [r for r in group if r["type"] == "tavily_search"]
        events = tuple(
            TraceEvent(
                t=float(r["endTime"]) - t0, mode="append", content=(r["content"] or "") + "\n"
            )
            for r in pages
        )
        meta: dict[str, Any] = {"source": "stream2llm-artifact", "file": file.name}
        if searches:
            meta["search_end"] = float(searches[0]["endTime"]) - t0
        trace_id = file.stem if len(groups) == 1 else f"{file.stem}-{k}"
        traces.append(Trace(trace_id, workload, "append", question, template, events, meta))
    return traces


def parse_pipeline_pool(pool: str) -> list[str]:
    """'(62952551,79119332)' -> ['62952551', '79119332']; '()' -> []."""
    pool = pool.strip().strip('()"')
    return [doc.strip() for doc in pool.split(",") if doc.strip()]


def load_ann_pipeline(
    csv_path: str | Path,
    query_map_path: str | Path,
    corpus_path: str | Path | Sequence[str | Path],
    template: str = DEFAULT_TEMPLATE,
    workload: str = "ann-artifact",
) -> list[Trace]:
    """Traces for the queries of the map whose trace CSV is `csv_path` (a file) or lies in it
    (a directory, like the artifact's data/anns/res). `corpus_path` is a JSON file, a glob
    pattern, or a list of files. Documents missing from the corpus are skipped, as the artifact
    does, and counted in meta["missing_docs"]."""
    csv_path = Path(csv_path)
    query_map: dict[str, dict[str, Any]] = read_json(Path(query_map_path))
    if not isinstance(query_map, dict) or not all(
        isinstance(v, dict) and "query" in v and "trace_file" in v for v in query_map.values()
    ):
        raise TraceFileError(
            query_map_path, None, 'expected {"<id>": {"query": ..., "trace_file": ...}, ...}'
        )
    corpus = _load_corpus(corpus_path)
    traces = []
    for query_id in sorted(query_map, key=_numeric_first):
        info = query_map[query_id]
        trace_file = Path(info["trace_file"])
        if csv_path.is_dir():
            file = csv_path / trace_file
            if not file.exists():
                continue
        elif trace_file.name == csv_path.name:
            file = csv_path
        else:
            continue
        meta = {k: v for k, v in info.items() if k not in ("query", "trace_file")}
        trace = _ann_file(file, str(query_id), info["query"], corpus, template, workload, meta)
        if trace is not None:
            traces.append(trace)
    return traces


def _numeric_first(key: str) -> tuple[int, int | str]:
    return (0, int(key)) if key.isdigit() else (1, key)


def _load_corpus(corpus_path: str | Path | Sequence[str | Path]) -> dict[str, str]:
    if isinstance(corpus_path, str | Path):
        files = sorted(glob.glob(str(corpus_path))) or [str(corpus_path)]
    else:
        files = [str(p) for p in corpus_path]
    corpus: dict[str, str] = {}
    for file in files:
        part = read_json(Path(file))
        if not isinstance(part, dict):
            raise TraceFileError(file, None, 'expected a corpus {"<docid>": "<text>", ...}')
        corpus.update(part)
    return corpus


def _ann_file(
    file: Path,
    query_id: str,
    question: str,
    corpus: dict[str, str],
    template: str,
    workload: str,
    meta: dict[str, Any],
) -> Trace | None:
    lines = read_csv(file, ANN_COLUMNS)
    if not lines:
        return None
    t = 0.0
    events = []
    pools = []
    missing = 0
    for line, row in lines:
        start, end = number(file, line, row, "StartTime_us"), number(file, line, row, "EndTime_us")
        if end < start:
            raise TraceFileError(file, line, "EndTime_us is before StartTime_us")
        for column in ("StartIteration", "EndIteration"):
            if not row[column].strip().lstrip("-").isdigit():
                raise TraceFileError(file, line, f"{column} is not an integer: {row[column]!r}")
        t += (end - start) / 1e6
        pool = parse_pipeline_pool(row["PipelinePool"])
        pools.append(pool)
        missing += sum(doc not in corpus for doc in pool)
        content = "".join(corpus[doc] + "\n" for doc in pool if doc in corpus)
        events.append(TraceEvent(t=t, mode="update", content=content))
    meta = {
        "source": "stream2llm-artifact",
        "file": file.name,
        "pools": pools,
        "iterations": [[int(r["StartIteration"]), int(r["EndIteration"])] for _, r in lines],
        "missing_docs": missing,
        **meta,
    }
    return Trace(query_id, workload, "update", question, template, tuple(events), meta)
