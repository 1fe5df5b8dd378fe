"""The operations console in a real browser (Chromium), against real API, worker, Redis and Triton.

What an operator does with it: sign in with a key, watch a lane fill and drain, cancel a batch,
replay a dead letter; and what it must never do: show a tenant another's job or batch, or
act on a request another site made the browser send.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from stack.processes import ManagedProcess
from tests.conftest import WorkerFactory
from tests.fixtures_api import ApiServer, Receiver, TenantKeys, api_url, start_api
from tests.fixtures_batches import embed_line, jsonl, start_batch_api
from tests.fixtures_console import Attacker, sign_in


@pytest.fixture(scope="module")
def idle_console(redis_url: str, run_dir: Path, tenants: TenantKeys) -> Iterator[str]:
    """An API whose prefix no worker serves: its batches stay in progress."""
    api = start_batch_api(run_dir, redis_url, "t-console-idle", tenants.path)
    yield api_url(api)
    api.stop()


def create_batch(base_url: str, tenants: TenantKeys, tenant: str, lines: int = 50) -> str:
    h = tenants.headers(tenant)
    with httpx.Client(base_url=base_url, timeout=30) as http:
        upload = http.post("/v1/files", headers=h, files={"file": ("in.jsonl", jsonl([embed_line(i) for i in range(lines)]))}, data={"purpose": "batch"})  # fmt: skip
        assert upload.status_code == 200, upload.text
        body = {
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/embeddings",
            "completion_window": "24h",
        }
        batch = http.post("/v1/batches", headers=h, json=body)
        assert batch.status_code == 200, batch.text
        deadline = time.monotonic() + 30
        while http.get(f"/v1/batches/{batch.json()['id']}", headers=h).json()["status"] != "in_progress":
            assert time.monotonic() < deadline, "the batch never started"
            time.sleep(0.2)
        return str(batch.json()["id"])


def batch_status(base_url: str, tenants: TenantKeys, tenant: str, batch_id: str) -> str:
    r = httpx.get(f"{base_url}/v1/batches/{batch_id}", headers=tenants.headers(tenant), timeout=30)
    return str(r.json()["status"])


def test_an_admin_sees_lanes_routes_gates_replicas_and_live_workers(
    page: Page, api_stack: ApiServer, tenants: TenantKeys
) -> None:
    sign_in(page, api_stack.url, tenants, "ops")
    expect(page.locator("#who")).to_have_text("ops (admin)")
    for lane in ("interactive", "bulk"):
        expect(page.get_by_test_id(f"depth-{lane}")).to_be_visible()
    for heading in ("Overflow gates", "Triton replicas", "Remote providers", "Workers"):
        expect(page.get_by_role("heading", name=heading)).to_be_visible()
    workers = page.locator("table", has=page.get_by_role("columnheader", name="last claim"))
    expect(workers.get_by_text("alive")).to_have_count(1)
    expect(page.get_by_role("link", name="Policy")).to_be_visible()


def test_a_tenant_key_sees_the_lanes_but_not_the_fleet(
    page: Page, api_stack: ApiServer, tenants: TenantKeys
) -> None:
    sign_in(page, api_stack.url, tenants, "acme")
    expect(page.get_by_test_id("depth-bulk")).to_be_visible()
    expect(page.get_by_role("heading", name="Workers")).to_have_count(0)
    expect(page.get_by_role("link", name="Policy")).to_be_hidden()


def test_the_lane_depth_and_each_tenants_load_rise_while_jobs_wait_and_fall_as_a_worker_takes_them(
    page: Page, redis_url: str, run_dir: Path, tenants: TenantKeys, prefix: str, start_worker: WorkerFactory
) -> None:
    api: ManagedProcess = start_api(run_dir, redis_url, prefix, tenants.path)
    try:
        url = api_url(api)
        sign_in(page, url, tenants, "ops")
        depth = page.get_by_test_id("depth-interactive")
        expect(depth).to_have_text("0")
        with httpx.Client(base_url=url, headers=tenants.headers("wide"), timeout=30) as http:
            for i in range(40):
                r = http.post(
                    "/v1/jobs", json={"kind": "embed", "body": {"model": "fixed-cost", "input": f"t{i}"}}
                )
                assert r.status_code == 202, r.text
        expect(depth).not_to_have_text("0", timeout=10_000)  # queued, no worker yet
        queued = int(depth.inner_text())
        assert queued > 0
        # The fair share's view of the lane: the tenant's row, its own alone for a tenant key.
        row = page.locator("tr[data-tenant='wide']")
        expect(row.locator("td").nth(2)).to_have_text("40", timeout=10_000)
        own = httpx.get(f"{url}/v1/console/overview", headers=tenants.headers("acme"), timeout=30).json()
        assert own["tenants"] == []
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        assert 'overspill_tenant_queued_items{lane="interactive",tenant="wide"} 40.0' in metrics
        start_worker(tenants_file=tenants.path)
        expect(depth).to_have_text("0", timeout=30_000)
        expect(page.get_by_test_id("route-local")).to_have_text("local 40", timeout=20_000)
    finally:
        api.stop()


def test_a_batch_cancelled_from_its_page_is_cancelled_in_the_api(
    page: Page, idle_console: str, tenants: TenantKeys
) -> None:
    batch_id = create_batch(idle_console, tenants, "acme")
    sign_in(page, idle_console, tenants, "acme", at="#/batches")
    page.get_by_role("link", name=batch_id).click()
    expect(page.get_by_test_id("batch-status")).to_have_text("in_progress")
    page.get_by_test_id("cancel-batch").click()
    # cancelling while its running jobs finish; none run here, so it may be cancelled at once
    expect(page.get_by_test_id("batch-status")).to_have_text(re.compile("^cancell(ing|ed)$"), timeout=10_000)
    assert batch_status(idle_console, tenants, "acme", batch_id) in ("cancelling", "cancelled")


def test_a_dead_letter_replayed_from_the_page_reaches_the_receiver(
    page: Page, api_stack: ApiServer, tenants: TenantKeys, receiver: Receiver
) -> None:
    path = receiver.new_path()
    receiver.answer(path, 400)  # first delivery refused: a dead letter; the replay gets a 200
    body = {"model": "fixed-cost", "input": "call me back"}
    options = {"webhook": {"url": receiver.url(path)}}
    with httpx.Client(base_url=api_stack.url, headers=tenants.headers("acme"), timeout=30) as http:
        job_id = http.post("/v1/jobs", json={"kind": "embed", "body": body, "options": options}).json()["id"]
        deadline = time.monotonic() + 30
        while not any(
            d["delivery"]["job_id"] == job_id for d in http.get("/v1/webhooks/dead-letters").json()["data"]
        ):
            assert time.monotonic() < deadline, "no dead letter"
            time.sleep(0.2)
    sign_in(page, api_stack.url, tenants, "acme", at="#/webhooks")
    row = page.locator("tr", has=page.get_by_role("link", name=job_id))
    row.get_by_test_id("replay").click()
    expect(page.get_by_test_id("replay-result")).to_contain_text("Replayed")
    deadline = time.monotonic() + 20
    while len(receiver.on(path)) < 2:  # Playwright's sync API owns this thread's event loop: poll
        assert time.monotonic() < deadline, "the replay never arrived"
        time.sleep(0.1)
    first, replayed = receiver.on(path)[:2]
    assert replayed.answered == 200 and replayed.headers["webhook-id"] == first.headers["webhook-id"]
    assert json.loads(replayed.body)["id"] == job_id


def test_a_tenant_cannot_open_another_tenants_job_or_batch(
    page: Page, api_stack: ApiServer, idle_console: str, tenants: TenantKeys
) -> None:
    secret_input = "acme's confidential sentence"
    with httpx.Client(base_url=api_stack.url, headers=tenants.headers("acme"), timeout=30) as http:
        job = http.post(
            "/v1/jobs", json={"kind": "embed", "body": {"model": "fixed-cost", "input": secret_input}}
        )
        job_id = job.json()["id"]
    sign_in(page, api_stack.url, tenants, "globex", at=f"#/jobs/{job_id}")
    expect(page.get_by_test_id("not-found")).to_be_visible()
    assert secret_input not in page.content() and "acme" not in page.inner_text("main")
    batch_id = create_batch(idle_console, tenants, "acme", lines=3)
    sign_in(page, idle_console, tenants, "globex", at=f"#/batches/{batch_id}")
    expect(page.get_by_test_id("not-found")).to_be_visible()
    assert "acme" not in page.inner_text("main")
    sign_in(page, api_stack.url, tenants, "acme", at=f"#/jobs/{job_id}")  # its owner does see it
    expect(page.get_by_test_id("job-status")).to_have_text("succeeded", timeout=10_000)


def test_a_cross_site_post_is_refused(
    page: Page, idle_console: str, tenants: TenantKeys, attacker: Attacker
) -> None:
    batch_id = create_batch(idle_console, tenants, "acme", lines=3)
    attacker.target = f"{idle_console}/v1/console/batches/{batch_id}/cancel"
    sign_in(page, idle_console, tenants, "acme")  # the victim is signed in, in the same browser
    with page.expect_response(attacker.target) as answer:
        page.goto(attacker.url)
    assert answer.value.status == 403 and "cross_site" in answer.value.text()
    assert batch_status(idle_console, tenants, "acme", batch_id) == "in_progress"
    forged = httpx.post(
        attacker.target, headers={**tenants.headers("acme"), "Origin": attacker.url.rstrip("/")}
    )
    assert forged.status_code == 403  # even with the key: a request from another origin


def test_an_admin_stores_a_policy_from_its_page_with_the_apis_validation(
    page: Page, idle_console: str, tenants: TenantKeys
) -> None:
    sign_in(page, idle_console, tenants, "ops", at="#/policy")  # a prefix no worker reads
    area = page.locator("textarea[name=policy]")
    area.fill('{"remote_ratio": 7}')
    page.get_by_role("button", name="Store policy").click()
    expect(page.get_by_test_id("policy-result")).to_contain_text("remote_ratio")
    stored = httpx.get(f"{idle_console}/v1/admin/policy", headers=tenants.headers("ops"), timeout=30).json()
    assert stored["stored"] is None  # refused: nothing changed
    area.fill('{"remote_ratio": 0.25}')
    page.get_by_role("button", name="Store policy").click()
    expect(page.get_by_test_id("policy-result")).to_contain_text("Stored")
    stored = httpx.get(f"{idle_console}/v1/admin/policy", headers=tenants.headers("ops"), timeout=30).json()
    assert stored["stored"]["remote_ratio"] == 0.25
    httpx.delete(f"{idle_console}/v1/admin/policy", headers=tenants.headers("ops"), timeout=30)
