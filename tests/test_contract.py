"""The contract: bodies validate like the OpenAI/Cohere APIs, options resolve, the wire is msgpack."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from producer.contract import (
    ErrorInfo,
    InvalidBody,
    JobKind,
    JobOptions,
    JobResult,
    Keys,
    Lane,
    LimitExceeded,
    Limits,
    Status,
    Timings,
    WorkItem,
    chunk_item_id,
    chunk_of,
    chunk_payload,
    days_between,
    expand_chunk,
    last_days,
    new_chunk_id,
    pack_job,
    parse_body,
    parse_day,
    request_fingerprint,
    trusted,
    unpack_job,
)


class TestBodies:
    def test_embedding_accepts_a_string_or_a_list(self) -> None:
        assert parse_body("embed", {"model": "m", "input": "hi"}).texts() == ["hi"]
        assert parse_body("embed", {"model": "m", "input": ["a", "b"]}).texts() == ["a", "b"]

    @pytest.mark.parametrize(
        ("body", "fragment"),
        [
            ({"model": "m", "input": ""}, "empty"),
            ({"model": "m", "input": []}, "empty"),
            ({"model": "m", "input": 42}, "input"),
            ({"input": "x"}, "model"),
            ("not an object", "JSON object"),
        ],
    )
    def test_bad_embedding_bodies_say_what_is_wrong(self, body: object, fragment: str) -> None:
        with pytest.raises(InvalidBody, match=fragment):
            parse_body("embed", body)

    def test_unknown_kind_is_rejected(self) -> None:
        with pytest.raises(InvalidBody, match="unknown job kind"):
            parse_body("translate", {"model": "m"})

    def test_limits_are_enforced_with_their_own_type(self) -> None:
        limits = Limits(max_input_chars=10, max_embed_inputs=2)
        with pytest.raises(LimitExceeded, match="characters"):
            parse_body("embed", {"model": "m", "input": "x" * 11}, limits)
        with pytest.raises(LimitExceeded, match="items"):
            parse_body("embed", {"model": "m", "input": ["a", "b", "c"]}, limits)
        assert LimitExceeded.type == "limit_exceeded"

    @pytest.mark.parametrize(
        "extra",
        [
            {"n": 2},
            {"stream": True, "n": 2},
            {"stream_options": {}},
            {"stream": True, "tools": [{"type": "function"}]},
        ],
    )
    def test_chat_rejects_what_it_does_not_implement(self, extra: dict[str, object]) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
        with pytest.raises(InvalidBody):
            parse_body("chat", body)

    def test_a_content_part_that_is_not_text_gets_one_clear_sentence(self) -> None:
        image = {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}}
        parts = [{"type": "text", "text": "what is this?"}, image]
        with pytest.raises(InvalidBody) as caught:
            parse_body("chat", {"model": "m", "messages": [{"role": "user", "content": parts}]})
        assert str(caught.value) == (
            "messages.0.content: content part 1 is of type 'image_url'; only text parts are served"
        )
        assert caught.value.param == "messages.0.content"
        ok = parse_body("chat", {"model": "m", "messages": [{"role": "user", "content": parts[:1]}]})
        assert ok.messages[0].text == "what is this?"

    def test_rerank_documents_may_be_strings_or_objects(self) -> None:
        req = parse_body("rerank", {"model": "m", "query": "q", "documents": ["a", {"text": "b"}]})
        assert req.texts() == ["a", "b"]


class TestOptions:
    def test_deadline_is_relative_or_absolute(self) -> None:
        now = time.time()
        assert JobOptions(deadline=30).deadline_at(now) == pytest.approx(now + 30)
        assert JobOptions(deadline=now + 99).deadline_at(now) == pytest.approx(now + 99)
        assert JobOptions(lane=Lane.bulk).deadline_at(now) - now == pytest.approx(24 * 3600)

    def test_local_only_cannot_be_routed_remote(self) -> None:
        with pytest.raises(ValueError, match="local_only"):
            JobOptions(local_only=True, route="remote")

    def test_unknown_options_are_refused(self) -> None:
        with pytest.raises(ValueError):
            JobOptions.model_validate({"priority": 1})


class TestWire:
    def test_packages_round_trip_through_msgpack_not_pickle(self) -> None:
        item = WorkItem(
            id="job_1", kind=JobKind.embed, body={"model": "m", "input": "é"}, created_at=1.0, deadline_at=2.0
        )
        data = pack_job({"items": [item.model_dump(mode="json")]})
        assert not data.startswith(b"\x80")  # the pickle protocol marker
        assert WorkItem.model_validate(unpack_job(data)["items"][0]) == item

    def test_keys_are_versioned_and_prefixed(self) -> None:
        keys = Keys("acme")
        assert keys.job("job_1") == "acme:v1:job:job_1"
        assert keys.queue(Lane.bulk) == "acme:v1:queue:bulk"
        assert Keys("a").job("x") != Keys("b").job("x")

    def test_fingerprint_ignores_key_order(self) -> None:
        a = request_fingerprint("embed", {"model": "m", "input": "x"})
        b = request_fingerprint("embed", {"input": "x", "model": "m"})
        assert a == b != request_fingerprint("embed", {"model": "m", "input": "y"})


class TestChunks:
    def test_a_chunk_package_expands_into_the_items_it_was_made_of(self) -> None:
        chunk = new_chunk_id()
        items = [
            WorkItem(
                id=chunk_item_id(chunk, i),
                kind=JobKind.embed,
                body={"model": "m", "input": f"t{i}"},
                lane=Lane.bulk,
                created_at=1.0,
                deadline_at=9.0,
                metadata={"run": "a"} if i != 3 else {"run": "a", "line": "3"},
            )
            for i in (2, 3, 7)
        ]
        payload = unpack_job(pack_job(chunk_payload(items)))
        assert [WorkItem.model_validate(raw) for raw in expand_chunk(payload)] == items

    def test_only_well_formed_ids_name_a_job_of_a_chunk(self) -> None:
        chunk = new_chunk_id()
        assert chunk_of(chunk_item_id(chunk, 41)) == (chunk, 41)
        for other in ("job_1", chunk, f"{chunk}.", f"{chunk}.01", f"{chunk}.-1", f"{chunk}.1.2", "chk_x.1"):
            assert chunk_of(other) is None

    def test_a_malformed_entry_comes_back_as_it_was_to_fail_alone(self) -> None:
        chunk = new_chunk_id()
        header = {"id": chunk, "kind": "embed", "lane": "bulk", "created_at": 1.0, "deadline_at": 2.0}
        out = expand_chunk({"chunk": header, "entries": [[0, {"input": "a"}], "junk", [-1, {}]]})
        assert out[0]["id"] == f"{chunk}.0" and out[1:] == ["junk", [-1, {}]]
        assert expand_chunk({"chunk": {**header, "id": "job_1"}, "entries": [[0, {}]]}) == []


def test_a_trusted_envelope_serialises_as_a_validated_one() -> None:
    values = {
        "id": "job_1",
        "kind": JobKind.embed,
        "status": Status.failed,
        "tenant": "acme",
        "route": None,
        "route_reason": None,
        "model": "m",
        "body": None,
        "error": ErrorInfo(type="invalid_request", message="no"),
        "timings": trusted(
            Timings, {"queued_ms": 1.0, "batch_ms": 2.0, "infer_ms": 3.0, "batch_size": 4, "total_ms": 5.0}
        ),
        "attempts": 1,
        "created_at": 1.0,
        "finished_at": 2.0,
        "metadata": {"k": "v"},
        "packed_vectors": None,
    }
    fast = trusted(JobResult, dict(values))
    assert fast.model_dump_json(exclude_none=True) == JobResult(**values).model_dump_json(exclude_none=True)
    assert fast == JobResult(**values)
    with pytest.raises(TypeError, match="every field"):
        trusted(JobResult, {"id": "job_1"})


def test_no_log_line_carries_a_url_password() -> None:
    """Whoever logs a URL (a Redis URL, a webhook with credentials), its password is masked."""
    code = (
        "from producer.contract import configure_logging, get_logger\n"
        "configure_logging()\n"
        "get_logger('t').warning('cannot reach redis://:hunter2@redis:6379/0', url='https://bob:pw9@h.example/x')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert "hunter2" not in done.stderr and "pw9" not in done.stderr
    assert (
        line["event"] == "cannot reach redis://:***@redis:6379/0"
        and line["url"] == "https://bob:***@h.example/x"
    )


class TestCommandPacking:
    """Clients from ``connect`` pack commands with hiredis: the same bytes redis-py's packer sends."""

    ARGS = [
        ("EVALSHA", "f" * 40, 2, "k:1", "k:2", 3600, "embed", repr(1733.25), "", "é" * 3, b"\x00\xff"),
        ("CONFIG GET", "maxmemory"),
        ("ZADD", "q", 1.0 / 3, "m"),
        ("SET", "k", memoryview(b"abc"), "EX", 10),
    ]

    @pytest.mark.parametrize("args", ARGS)
    def test_the_bytes_are_redis_pys(self, args: tuple[object, ...]) -> None:
        from redis.asyncio.connection import Connection

        from producer.contract.redis import connect

        fast = connect("redis://127.0.0.1:1/0").connection_pool.connection_class()
        assert type(fast) is not Connection and isinstance(fast, Connection)
        assert b"".join(fast.pack_command(*args)) == b"".join(
            bytes(p) for p in Connection().pack_command(*args)
        )

    def test_a_value_redis_py_refuses_is_still_refused(self) -> None:
        from redis.exceptions import DataError

        from producer.contract.redis import connect

        fast = connect("redis://127.0.0.1:1/0").connection_pool.connection_class()
        with pytest.raises(DataError, match="NoneType"):
            fast.pack_command("SET", "k", None)


@pytest.mark.parametrize(
    "text", ["20261207", "2026-W49-1", "2026-12-7", " 2026-12-07", "0000-01-01", "2026-02-29"]
)
def test_a_day_is_written_yyyy_mm_dd_and_nothing_else(text: str) -> None:
    with pytest.raises(ValueError):
        parse_day(text)


def test_a_period_is_cut_to_its_last_days_at_both_ends_of_the_calendar() -> None:
    first, last = parse_day("0001-01-01"), parse_day("0001-01-05")
    assert last_days(first, last, 400) == first  # 399 days before year 1 is no date
    assert days_between(last_days(first, last, 400), last) == [f"0001-01-0{d}" for d in range(1, 6)]
    end = parse_day("9999-12-31")
    assert last_days(parse_day("0001-01-01"), end, 400) == parse_day("9998-11-27")
    assert len(days_between(last_days(parse_day("0001-01-01"), end, 400), end)) == 400
