"""`docker compose up` runs the production shape for real (`make compose-test`).

compose.yaml is built and started on a private Docker engine, with only what this machine
forces changed (tests/compose/override.yaml), and spoken to through the published API port:

- every service becomes healthy, both worker replicas included;
- the README's client (inside the compose network) and the ``openai`` SDK get answers for
  embed, chat and rerank, and an OpenAI Batch runs to completion;
- a worker replica killed under load loses no job, and comes back; a crashed one restarts itself;
- Redis restarted under load (AOF on its named volume): every accepted job ends terminal;
- no secret appears in a container's environment, command or log; no key, no answer;
- a deliberately broken compose file fails ``up --wait``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from stack.processes import free_port
from tests.compose.conftest import HERE, Stack, machine_variables
from tests.compose.engine import BASE_IMAGE, ROOT, Compose
from tests.compose.load import Load

EMBED = {"model": "all-MiniLM-L6-v2", "input": "hello"}
CHAT = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
LOAD_JOBS = 400
RERANK = {"model": "minilm-l6-cosine-rerank", "query": "capital of France", "documents": ["Paris", "a cat"]}

# The README's "Using it", run where the README's reader would run it: beside Redis.
README_CLIENT = """
import asyncio, json
from producer import Client

async def main():
    async with Client("redis://redis:6379/0") as client:
        for kind, body in json.loads(BODIES):
            job = await client.submit(kind, body)
            result = await client.wait(job, timeout=120)
            print(json.dumps({"kind": kind, "status": str(result.status), "body": result.body}))

asyncio.run(main())
"""


def _count(report: dict[str, Any], outcomes: Counter[str], submitted: int) -> None:
    report["compose_jobs_submitted"] = report.get("compose_jobs_submitted", 0) + submitted
    report["compose_jobs_ok"] = report.get("compose_jobs_ok", 0) + outcomes["succeeded"]


def _workers(stack: Stack) -> list[dict[str, Any]]:
    return stack.compose.containers("worker")


async def _until(check, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return True
        await asyncio.sleep(1)
    return False


def test_every_service_becomes_healthy(stack: Stack) -> None:
    containers = stack.compose.containers()
    assert Counter(c["Service"] for c in containers) == {"redis": 1, "triton": 1, "worker": 2, "api": 1}
    assert all(c["Health"] == "healthy" for c in containers), [(c["Name"], c["Health"]) for c in containers]


def test_a_request_without_a_key_is_refused(stack: Stack) -> None:
    for headers in ({}, {"Authorization": "Bearer osk_not-a-key"}):
        response = httpx.post(f"{stack.api}/v1/embeddings", json=EMBED, headers=headers, timeout=30)
        assert response.status_code == 401, response.text


def test_the_readme_client_gets_embed_chat_and_rerank_answers(stack: Stack, report: dict[str, Any]) -> None:
    bodies = json.dumps([["embed", EMBED], ["chat", CHAT], ["rerank", RERANK]])
    out = stack.compose(
        "run", "--rm", "--no-deps", "-T", "-e", f"BODIES={bodies}", "worker",
        "python", "-c", f"import os; BODIES = os.environ['BODIES']\n{README_CLIENT}",
    )  # fmt: skip
    results = {r["kind"]: r for r in map(json.loads, out.splitlines()) if r}
    assert {k: r["status"] for k, r in results.items()} == dict.fromkeys(
        ("embed", "chat", "rerank"), "succeeded"
    )
    assert len(results["embed"]["body"]["data"][0]["embedding"]) == 384
    assert results["chat"]["body"]["choices"][0]["message"]["content"]
    assert {r["index"] for r in results["rerank"]["body"]["results"]} == {0, 1}
    _count(report, Counter(r["status"] for r in results.values()), 3)


def test_the_openai_sdk_gets_answers_and_runs_a_batch(stack: Stack, report: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=f"{stack.api}/v1", api_key=stack.api_key, timeout=60, max_retries=0)
    vectors = client.embeddings.create(model=EMBED["model"], input=["hello", "world"])
    assert [len(d.embedding) for d in vectors.data] == [384, 384]
    chat = client.chat.completions.create(**CHAT)
    assert chat.choices[0].message.content
    rerank = httpx.post(f"{stack.api}/v1/rerank", json=RERANK, timeout=60,
                        headers={"Authorization": f"Bearer {stack.api_key}"})  # fmt: skip
    assert rerank.status_code == 200 and rerank.json()["results"][0]["index"] == 0, rerank.text

    lines = [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": EMBED["model"], "input": f"batch line {i}"}}
        for i in range(20)
    ]  # fmt: skip
    upload = client.files.create(
        file=("in.jsonl", "\n".join(map(json.dumps, lines)).encode()), purpose="batch"
    )
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.monotonic() + 180
    while batch.status not in {"completed", "failed", "expired", "cancelled"} and time.monotonic() < deadline:
        time.sleep(1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in output) == sorted(line["custom_id"] for line in lines)
    assert all(len(o["response"]["body"]["data"][0]["embedding"]) == 384 for o in output)
    _count(report, Counter({"succeeded": 3 + len(output)}), 3 + len(lines))


async def _under_load(
    stack: Stack, fault: Callable[[], object], *, per_s: float
) -> tuple[Load, Counter[str]]:
    """``LOAD_JOBS`` jobs at ``per_s``, with ``fault`` done 1.5 s in: what became of each accepted one."""
    load = Load(stack.api, stack.api_key)
    submitting = asyncio.create_task(load.submit(LOAD_JOBS, per_s=per_s))
    await asyncio.sleep(1.5)
    await asyncio.to_thread(fault)
    await submitting
    return load, await load.outcomes()


@pytest.mark.timeout(420)
async def test_a_worker_replica_killed_under_load_loses_no_job_and_comes_back(
    stack: Stack, report: dict[str, Any]
) -> None:
    victim = _workers(stack)[0]["Name"]
    # What `docker compose kill` does to each container it is given: SIGKILL.
    load, outcomes = await _under_load(stack, lambda: stack.compose.engine.docker("kill", victim), per_s=100)
    report["compose_lost_worker_kill"] = outcomes["lost"]
    _count(report, outcomes, LOAD_JOBS)
    assert not load.refused and outcomes == {"succeeded": LOAD_JOBS}, (load.refused, outcomes)
    # Docker counts a kill as a stop by hand; compose brings the replica back.
    await asyncio.to_thread(stack.compose.up, "worker")
    assert [w["Health"] for w in _workers(stack)] == ["healthy", "healthy"]


async def test_a_crashed_worker_replica_restarts_by_itself(stack: Stack) -> None:
    victim = _workers(stack)[-1]["Name"]
    pid = int(stack.compose.engine.docker("inspect", "-f", "{{.State.Pid}}", victim).strip())
    os.kill(pid, signal.SIGKILL)  # the process dies, as in an OOM kill: `restart: unless-stopped` acts

    def back() -> bool:
        state = json.loads(stack.compose.engine.docker("inspect", victim))[0]
        return state["RestartCount"] >= 1 and state["State"].get("Health", {}).get("Status") == "healthy"

    assert await _until(back, 90)


@pytest.mark.timeout(420)
async def test_redis_restarted_under_load_every_accepted_job_ends_once(
    stack: Stack, report: dict[str, Any]
) -> None:
    load, outcomes = await _under_load(stack, lambda: stack.compose("restart", "redis"), per_s=80)
    report["compose_lost_redis_restart"] = outcomes["lost"]
    report["compose_refused_redis_restart"] = sum(load.refused.values())
    _count(report, outcomes, len(load.accepted))
    assert load.accepted and outcomes["lost"] == 0, outcomes
    assert set(outcomes) <= {"succeeded", "failed"}, outcomes
    # Refused while Redis was down means an answer the producer could act on: 503, never a hang.
    assert set(load.refused) <= {503}, load.refused


def test_no_secret_in_any_environment_command_or_log(stack: Stack) -> None:
    engine = stack.compose.engine
    for container in stack.compose.containers():
        config = json.loads(engine.docker("inspect", container["Name"]))[0]["Config"]
        seen = json.dumps([config.get("Env"), config.get("Cmd"), config.get("Entrypoint")])
        assert not any(secret in seen for secret in stack.secrets), container["Name"]
    logs = stack.compose("logs", "--no-color", timeout=120)
    assert len(logs) > 1000 and not any(secret in logs for secret in stack.secrets)


def test_a_broken_compose_file_fails_up(stack: Stack, tmp_path: Path) -> None:
    """The check can fail: an API whose command names no module never becomes healthy."""
    variables = {**stack.compose.variables, **machine_variables(BASE_IMAGE, free_port())}
    broken = Compose(
        stack.compose.engine, "overspill-broken",
        [ROOT / "compose.yaml", HERE / "override.yaml", HERE / "broken.yaml"], variables,
    )  # fmt: skip
    try:
        with pytest.raises(RuntimeError, match="not every service is healthy.*api"):
            broken.up("api", timeout_s=60)
    finally:
        broken("down", "--volumes", "--timeout", "5", timeout=120, check=False)
