"""Any trace file for `s2l bench --traces`: the normalized JSONL and the artifact's CSVs, read
by what the path is; malformed files named with their line, and the CLI's exit code 2."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest

from bench import cli
from bench.tracefiles import read_any, workload_name
from bench.traces import DEFAULT_TEMPLATE, TraceFileError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "artifact"


def trace_line(id_: str = "q1", **kw) -> str:
    d = {
        "id": id_,
        "workload": "mine",
        "mode": "append",
        "question": "Why?",
        "template": DEFAULT_TEMPLATE,
        "events": [
            {"t": 0.5, "mode": "append", "content": "alpha "},
            {"t": 1.0, "mode": "append", "content": "beta "},
        ],  # fmt: skip
    }
    d.update(kw)
    return orjson.dumps(d).decode()


def write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def error_of(path: Path) -> TraceFileError:
    with pytest.raises(TraceFileError) as info:
        read_any(path)
    return info.value


def test_normalized_jsonl_plain_and_compressed(tmp_path):
    plain = write(tmp_path / "mine.jsonl", trace_line("a"), "", trace_line("b"))
    assert [t.id for t in read_any(plain)] == ["a", "b"]
    packed = tmp_path / "mine.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert [t.final_context for t in read_any(packed)] == ["alpha beta "] * 2
    assert workload_name(packed) == "mine" and workload_name(plain, ["mine"]) == "mine-2"


@pytest.mark.parametrize(
    "bad, line, message",
    [
        ('{"id": "b", "events": [', 3, "not JSON"),
        ('["a list"]', 3, "expected a JSON object"),
        (trace_line("b", question=None), 3, "field 'question'"),
        (trace_line("b", events=[{"t": "soon", "mode": "append", "content": "x"}]), 3, "'t'"),
        (trace_line("b", events=[{"t": 2, "mode": "append", "content": "x"},
                                 {"t": 1, "mode": "append", "content": "y"}]), 3, "not ordered"),
        (trace_line("b", mode="insert"), 3, "mode"),
        (trace_line("a"), 3, "duplicate trace id 'a'"),
    ],
)  # fmt: skip
def test_malformed_jsonl_names_the_file_and_line(tmp_path, bad, line, message):
    path = write(tmp_path / "t.jsonl", trace_line("a"), "", bad)
    err = error_of(path)
    assert (err.path, err.line) == (str(path), line) and message in err.message
    assert str(err).startswith(f"{path}:{line}: ")


def test_artifact_crawler_csv_and_folder():
    assert [t.id for t in read_any(FIXTURES / "crawler" / "query_2.csv")] == ["query_2"]
    assert [t.id for t in read_any(FIXTURES / "crawler")] == ["query_2", "query_10"]


@pytest.mark.parametrize(
    "rows, line, message",
    [
        (["type,query,content,startTime", "page_scrape,q,x,0.1"], 1, "missing column(s) endTime"),
        (["type,query,content,startTime,endTime", "page_scrape,q,x,0.1,0.2",
          "page_scrape,q,y,0.3,late"], 3, "endTime is not a number: 'late'"),
        (["type,query,content,startTime,endTime", "image,q,x,0.1,0.2"], 2, "type must be"),
        (["type,query,content,startTime,endTime", "page_scrape,q,x,0.5,0.2"], 2, "before"),
        (["type,query,content,startTime,endTime", "page_scrape,q,x,0.1"], 2, "number of fields"),
        (["a,b", "1,2"], 1, "unknown CSV columns"),
    ],
)  # fmt: skip
def test_malformed_crawler_csv_names_the_line(tmp_path, rows, line, message):
    err = error_of(write(tmp_path / "query_1.csv", *rows))
    assert err.line == line and message in err.message


def test_artifact_ann_csv_finds_its_map_and_corpus_one_folder_up():
    (trace,) = read_any(FIXTURES / "ann" / "res" / "1_pipeline_trace.csv")
    assert trace.id == "1" and trace.mode == "update"
    assert [t.id for t in read_any(FIXTURES / "ann")] == ["0", "1"]


def test_malformed_ann_files(tmp_path):
    ann = tmp_path / "ann"
    shutil.copytree(FIXTURES / "ann", ann)
    csv = ann / "res" / "0_pipeline_trace.csv"
    good = csv.read_text()
    csv.write_text(good.replace("1020000,1056700", "1020000,soon"))
    err = error_of(csv)
    assert err.path == str(csv) and err.line == 3 and "EndTime_us is not a number" in err.message
    csv.write_text(good.replace("1056700,5000000", "5000000,1056700"))
    assert error_of(ann).line == 4  # the window ends before it starts
    csv.write_text(good)
    (ann / "query_trace_map.json").write_text('{\n  "0": {"query": "q",\n  oops\n}')
    err = error_of(csv)
    assert err.path.endswith("query_trace_map.json") and err.line == 3
    (ann / "query_trace_map.json").unlink()
    assert "needs query_trace_map.json" in error_of(csv).message


def test_paths_that_are_not_trace_files(tmp_path):
    assert "no such file" in error_of(tmp_path / "nope.jsonl").message
    assert "unknown format" in error_of(write(tmp_path / "t.txt", "hi")).message
    (tmp_path / "empty").mkdir()
    assert "trace folder holds" in error_of(tmp_path / "empty").message
    assert "no traces" in error_of(write(tmp_path / "blank.jsonl", "")).message
    garbage = tmp_path / "t.jsonl.xz"
    garbage.write_bytes(b"not xz at all")
    assert "cannot read" in error_of(garbage).message


def test_cli_replays_trace_files_as_workloads_with_the_presets_settings(tmp_path):
    mine = write(tmp_path / "mine.jsonl", trace_line("a"), trace_line("b"))
    args = cli.build_parser().parse_args(
        ["--traces", str(mine), str(FIXTURES / "crawler"), "--rates", "0.2,0.4"]
    )
    p = cli.preset_from_args(args)
    assert [(w.name, w.rates, w.queries) for w in p.workloads] == [
        ("mine", (0.2, 0.4), 6), ("crawler", (0.2, 0.4), 6)
    ]  # fmt: skip
    assert p.workloads[0].path == mine and p.modes == ("wait", "warming", "sessions", "stream")


def test_cli_exits_2_with_the_file_and_line_and_no_traceback(tmp_path, capsys):
    bad = write(tmp_path / "bad.jsonl", trace_line("a"), "{nope")
    assert cli.main(["--traces", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: not JSON" in err and "Traceback" not in err
