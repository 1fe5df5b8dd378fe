"""``overspill bulk`` on tables: Parquet, CSV and JSONL of texts in, Parquet of vectors out.

The command runs as a process straight to Redis, against a worker of this module and the
session's Triton. The vectors it writes are the ones a single job gets for the same text; a
kill -9 half-way and the same command again write every row once, and run no window twice.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from producer import Client
from producer.batches.tables import Parts, TableRun
from producer.contract import Keys, day_of
from producer.contract.usage import SEP
from stack.processes import ROOT, ManagedProcess, python_process
from tests.conftest import Triton, worker_env

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def table_worker(redis_url: str, triton: Triton, run_dir: Path) -> Iterator[tuple[str, ManagedProcess]]:
    prefix = "t-table-" + secrets.token_hex(3)
    env = worker_env(redis_url, triton, prefix)
    worker = python_process("worker", "workers", run_dir, env, log_name=f"worker-{prefix}").start()
    yield prefix, worker
    worker.stop()


def bulk_command(redis_url: str, prefix: str, *args: str) -> list[str]:
    exe = str(Path(sys.executable).parent / "overspill")
    return [exe, "bulk", *args, "--redis-url", redis_url, "--prefix", prefix]


def run_bulk(redis_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        bulk_command(redis_url, prefix, *args),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ},
    )


async def test_a_parquet_of_texts_becomes_a_parquet_of_the_vectors_a_job_gets(
    table_worker: tuple[str, ManagedProcess], redis_url: str, tmp_path: Path
) -> None:
    prefix, _ = table_worker
    texts = [f"row {i}: " + "a table of texts, embedded " * (1 + i % 5) for i in range(60)]
    source = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"doc_id": [f"d{i}" for i in range(60)], "body": texts}), source, row_group_size=25
    )
    out = tmp_path / "out.parquet"
    run = run_bulk(redis_url, prefix, str(source), "-o", str(out), "--model", MODEL,
                   "--text-column", "body", "--id-column", "doc_id", "--window-rows", "32")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"output": str(out), "rows": 60, "failed": 0, "parts": 2}
    assert "row" in run.stderr  # the progress bar
    table = pq.read_table(out)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert table.column("id").to_pylist() == [f"d{i}" for i in range(60)]  # input order
    assert all(t > 0 for t in table.column("prompt_tokens").to_pylist())
    assert set(table.column("route").to_pylist()) == {"local"} and table.column("error").null_count == 60
    assert not out.with_name("out.parquet.parts").exists()
    vectors = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(60, 384)
    async with Client(redis_url, prefix=prefix) as client:
        for i in (0, 17, 59):
            job = await client.wait(
                await client.submit("embed", {"model": MODEL, "input": texts[i]}), timeout=60
            )
            assert np.allclose(vectors[i], job.vectors()[0], atol=1e-5)


def test_csv_and_jsonl_of_texts_are_tables_too_and_a_bad_row_fails_alone(
    table_worker: tuple[str, ManagedProcess], redis_url: str, tmp_path: Path
) -> None:
    prefix, _ = table_worker
    csv = tmp_path / "in.csv"
    csv.write_text("text\n" + "".join(f'"line {i}, with a comma"\n' for i in range(40)))
    run = run_bulk(redis_url, prefix, str(csv), "-o", str(tmp_path / "csv.parquet"), "--model", "fixed-cost")
    assert run.returncode == 0, run.stderr
    assert pq.read_table(tmp_path / "csv.parquet").column("id").to_pylist() == list(range(40))  # row numbers
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps(t) + "\n" for t in ["first", "x" * 200_000, "third"]))
    run = run_bulk(redis_url, prefix, str(lines), "-o", str(tmp_path / "j.parquet"), "--model", "fixed-cost")
    assert run.returncode == 3, run.stderr  # a row failed: exit 3, every row still written
    table = pq.read_table(tmp_path / "j.parquet")
    assert table.num_rows == 3 and table.column("prompt_tokens").null_count == 1
    vectors = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(3, -1)
    assert np.isnan(vectors[1]).all() and not np.isnan(vectors[[0, 2]]).any()  # never a vector
    error = table.column("error").to_pylist()
    assert error[0] is None and error[2] is None and error[1].startswith("limit_exceeded: ")
    missing = run_bulk(redis_url, prefix, str(csv), "-o", str(tmp_path / "m.parquet"), "--model", "fixed-cost",
                       "--text-column", "nope")  # fmt: skip
    assert missing.returncode == 1 and "nope" in missing.stderr


RERANK = "minilm-l6-cosine-rerank"
CHAT = "SmolLM2-135M-Instruct"


async def test_a_rerank_table_becomes_ranked_results_a_job_gets(
    table_worker: tuple[str, ManagedProcess], redis_url: str, tmp_path: Path
) -> None:
    prefix, _ = table_worker
    docs = ["Paris is the capital of France.", "Bananas are yellow.", "The Seine flows through Paris.",
            "Berlin is in Germany.", "A cat sleeps."]  # fmt: skip
    queries = [f"capital {i}: where is Paris?" for i in range(20)]
    source = tmp_path / "queries.parquet"
    pq.write_table(pa.table({"q": queries, "documents": [docs[i % 2 :] for i in range(20)]}), source)
    out = tmp_path / "ranked.parquet"
    run = run_bulk(redis_url, prefix, str(source), "-o", str(out), "--kind", "rerank", "--model", RERANK,
                   "--query-column", "q", "--top-n", "3", "--window-rows", "8")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == {"output": str(out), "rows": 20, "failed": 0, "parts": 3}
    table = pq.read_table(out)
    assert table.column_names == ["id", "results", "total_tokens", "route", "error"]
    assert table.column("id").to_pylist() == list(range(20))
    ranked = table.column("results").to_pylist()
    assert all(len(r) == 3 for r in ranked) and table.column("error").null_count == 20
    async with Client(redis_url, prefix=prefix) as client:
        for i in (0, 1):
            body = {"model": RERANK, "query": queries[i], "documents": docs[i % 2 :], "top_n": 3}
            job = await client.wait(await client.submit("rerank", body), timeout=60)
            assert [r["index"] for r in ranked[i]] == [r["index"] for r in job.body["results"]]
            assert np.allclose([r["relevance_score"] for r in ranked[i]],
                               [r["relevance_score"] for r in job.body["results"]], atol=1e-6)  # fmt: skip
            assert table.column("total_tokens")[i].as_py() == job.body["usage"]["total_tokens"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "documents": "not a list"}) + "\n")
    refused = run_bulk(redis_url, prefix, str(bad), "-o", str(tmp_path / "bad.parquet"), "--kind", "rerank",
                       "--model", RERANK)  # fmt: skip
    assert refused.returncode == 1 and "'documents' must be a non-empty list of texts" in refused.stderr


async def test_a_chat_table_becomes_the_completions_a_job_gets(
    table_worker: tuple[str, ManagedProcess], redis_url: str, tmp_path: Path
) -> None:
    prefix, _ = table_worker
    prompts = ["Name a colour.", "Name a fruit.", "Name a planet."]
    source = tmp_path / "prompts.csv"
    source.write_text("prompt\n" + "".join(f'"{p}"\n' for p in prompts))
    out = tmp_path / "answers.parquet"
    system = "You are a concise assistant."
    run = run_bulk(redis_url, prefix, str(source), "-o", str(out), "--kind", "chat", "--model", CHAT,
                   "--text-column", "prompt", "--system", system, "--max-tokens", "5", "--temperature", "0")  # fmt: skip
    assert run.returncode == 0, run.stderr
    table = pq.read_table(out)
    assert table.column_names == [
        "id", "text", "finish_reason", "prompt_tokens", "completion_tokens", "route", "error"
    ]  # fmt: skip
    async with Client(redis_url, prefix=prefix) as client:
        body = {"model": CHAT, "max_tokens": 5, "temperature": 0,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompts[1]}]}  # fmt: skip
        job = await client.wait(await client.submit("chat", body), timeout=120)
    assert table.column("text")[1].as_py() == job.body["choices"][0]["message"]["content"]
    assert table.column("finish_reason")[1].as_py() == job.body["choices"][0]["finish_reason"]
    assert all(0 < t <= 5 for t in table.column("completion_tokens").to_pylist())
    assert set(table.column("route").to_pylist()) == {"local"} and table.column("error").null_count == 3
    assert table.column("prompt_tokens")[1].as_py() == job.body["usage"]["prompt_tokens"]


def test_a_kill_half_way_then_the_same_command_writes_every_row_once(
    redis_url: str, triton: Triton, run_dir: Path, tmp_path: Path
) -> None:
    prefix = "t-table-kill-" + secrets.token_hex(3)
    worker = python_process("worker", "workers", run_dir, worker_env(redis_url, triton, prefix),
                            log_name=f"worker-{prefix}").start()  # fmt: skip
    try:
        rows = run_and_kill(redis_url, prefix, tmp_path)
    finally:
        worker.stop()  # its usage ledger is flushed as it stops
    # Every row ran once: nothing the first run had sent ran again. A written window's chunks
    # leave Redis with it, so the witness is the worker's usage ledger, which counts items run.
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    ledger = r.hgetall(Keys(prefix).usage(day_of(time.time())))
    assert sum(int(float(v)) for f, v in ledger.items() if f.endswith(SEP + "items")) == rows
    assert list(r.scan_iter(Keys(prefix).chunk("*"), count=1000)) == []  # and Redis holds none of it


def run_and_kill(redis_url: str, prefix: str, tmp_path: Path) -> int:
    rows = 6000
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"resumable row {i}" for i in range(rows)]}), source)
    out = tmp_path / "out.parquet"
    args = (str(source), "-o", str(out), "--model", "fixed-cost", "--window-rows", "200")
    parts = out.with_name("out.parquet.parts")
    first = subprocess.Popen(bulk_command(redis_url, prefix, *args), cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(parts.glob("part-*.parquet"))) < 3:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    written = len(list(parts.glob("part-*.parquet")))
    assert 3 <= written < rows // 200, "killed half-way"
    second = run_bulk(redis_url, prefix, *args)
    assert second.returncode == 0, second.stderr
    assert sorted(pq.read_table(out).column("id").to_pylist()) == list(range(rows))
    return rows


async def test_a_kill_between_a_part_and_its_cleanup_leaves_no_chunk_behind(
    redis_url: str, tmp_path: Path
) -> None:
    """A part is on disk and its ids file still names its chunks (killed before they were
    deleted): the resume deletes them, and writes the output from the part it has."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["only row"]}), source)
    out = tmp_path / "out.parquet"
    prefix = "t-table-left-" + secrets.token_hex(3)
    async with Client(redis_url, prefix=prefix, coalesce_window_ms=None) as client:
        run = TableRun(client, source, out, "fixed-cost")
        identity = {"input": str(source.resolve()), "rows": run.window_rows, "model": "fixed-cost"}
        parts = Parts(out, identity)
        chunk = "chk_" + secrets.token_hex(12)
        await client.redis.hset(client.keys.chunk(chunk), mapping={"n": 1, "kind": "embed"})
        parts.keep_ids(0, [f"{chunk}.0"])
        parts.write(0, pa.table({"id": [0], "error": ["left by the first run"]}))
        summary = await run.run()
        assert summary["rows"] == 1
        assert await client.redis.exists(client.keys.chunk(chunk)) == 0
    assert pq.read_table(out).column("error").to_pylist() == ["left by the first run"]
