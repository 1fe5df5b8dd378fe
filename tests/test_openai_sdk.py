"""The request shapes the real ``openai`` SDK sends, against the real API, workers and Triton:
content parts, the developer role, assistant ``content: null``, embeddings options the models
cannot honour, ``logprobs``, ``x-request-id``, error ``param``s, and ``GET /v1/models``.
"""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest

from producer.batches.lines import Entry, output_line
from producer.contract import InvalidBody, JobKind, parse_body
from stack import fake_remote
from tests.fixtures_api import ApiServer, TenantKeys
from tests.fixtures_batches import (
    BatchStack,
    embed_line,
    full_lines,
    jsonl,
    run_batch,
    wait_batch,
    wait_for_submitted,
)
from workers.app import model_cards
from workers.core import WorkerConfig

CHAT_MODEL = "SmolLM2-135M-Instruct"
EMBED_MODEL = "all-MiniLM-L6-v2"


def sdk(api: ApiServer, tenants: TenantKeys) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{api.url}/v1", api_key=tenants.keys["acme"], max_retries=0, timeout=60
    )


class TestBodies:
    def test_error_names_the_field_without_pydantic_prefix(self) -> None:
        body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 99}
        with pytest.raises(InvalidBody) as exc:
            parse_body(JobKind.chat, body)
        assert exc.value.param == "top_logprobs"
        assert str(exc.value) == "top_logprobs: Input should be less than or equal to 20"

    def test_content_parts_and_null_become_text(self) -> None:
        body = {
            "model": CHAT_MODEL,
            "messages": [
                {
                    "role": "developer",
                    "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
                },
                {"role": "assistant", "content": None},
                {"role": "user", "content": "hi"},
            ],
        }
        request = parse_body(JobKind.chat, body)
        assert [(m.prompt_role, m.text) for m in request.messages] == [  # type: ignore[union-attr]
            ("system", "Be brief."),
            ("assistant", ""),
            ("user", "hi"),
        ]

    def test_user_content_null_is_refused(self) -> None:
        with pytest.raises(InvalidBody) as exc:
            parse_body(JobKind.chat, {"model": CHAT_MODEL, "messages": [{"role": "user", "content": None}]})
        assert exc.value.param == "messages.0"
        assert "content is required for a user message" in str(exc.value)

    def test_the_fake_remote_reads_content_parts(self) -> None:
        parts = [{"type": "text", "text": "two "}, {"type": "text", "text": "words"}]
        answer = fake_remote.chat({"model": "m", "messages": [{"role": "user", "content": parts}]})
        assert answer["choices"][0]["message"]["content"] == "echo: two words"

    def test_catalogue_without_remotes_is_local_only(self) -> None:
        cards = {c.id: c for c in model_cards(WorkerConfig(), None, now=1.0)}
        assert cards[CHAT_MODEL].served == ["local"]
        assert cards[CHAT_MODEL].kind == JobKind.chat
        assert "HuggingFaceTB/SmolLM2-135M-Instruct" in cards[CHAT_MODEL].names()


class TestChatShapes:
    async def test_parts_developer_and_null_assistant_answer_as_plain_text(
        self, api_stack: ApiServer, tenants: TenantKeys
    ) -> None:
        """Content parts mean their joined text: the answer equals the plain-string request's."""
        common = {"model": CHAT_MODEL, "max_tokens": 8, "temperature": 0}
        async with sdk(api_stack, tenants) as client:
            parts = await client.chat.completions.create(
                messages=[
                    {"role": "developer", "content": [{"type": "text", "text": "Answer in one word."}]},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "Name a "}, {"type": "text", "text": "fruit."}],
                    },
                ],
                **common,  # type: ignore[arg-type]
            )
            plain = await client.chat.completions.create(
                messages=[
                    {"role": "system", "content": "Answer in one word."},
                    {"role": "user", "content": "Name a fruit."},
                ],
                **common,  # type: ignore[arg-type]
            )
            with_null = await client.chat.completions.create(
                messages=[
                    {"role": "user", "content": "Hi."},
                    {"role": "assistant", "content": None},
                    {"role": "user", "content": "Name a fruit."},
                ],
                **common,  # type: ignore[arg-type]
            )
        assert parts.choices[0].message.content == plain.choices[0].message.content
        assert parts.choices[0].message.content
        assert with_null.choices[0].message.content
        assert parts._request_id and parts._request_id.startswith("req_")
        assert parts._request_id != plain._request_id

    async def test_logprobs_without_a_remote_that_offers_them_are_refused_naming_the_field(
        self, api_stack: ApiServer, tenants: TenantKeys
    ) -> None:
        async with sdk(api_stack, tenants) as client:
            with pytest.raises(openai.BadRequestError) as exc:
                await client.chat.completions.create(
                    model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}], logprobs=True
                )
        err = exc.value.body
        assert isinstance(err, dict)
        assert (err["param"], err["code"]) == ("logprobs", "model_lacks_capability")
        assert err["message"] == (
            "logprobs: model 'SmolLM2-135M-Instruct' offers no logprobs locally or on any remote"
        )
        assert exc.value.request_id and exc.value.request_id.startswith("req_")


class TestEmbeddingShapes:
    async def test_dimensions_is_refused(self, api_stack: ApiServer, tenants: TenantKeys) -> None:
        async with sdk(api_stack, tenants) as client:
            with pytest.raises(openai.BadRequestError) as exc:
                await client.embeddings.create(model=EMBED_MODEL, input="hello", dimensions=128)
        assert isinstance(exc.value.body, dict)
        assert exc.value.body["param"] == "dimensions"
        assert "does not support specifying dimensions" in exc.value.body["message"]

    @pytest.mark.parametrize("tokens", [[15339, 1917], [[15339, 1917]]])
    async def test_token_ids_are_refused(
        self, api_stack: ApiServer, tenants: TenantKeys, tokens: list
    ) -> None:
        async with sdk(api_stack, tenants) as client:
            with pytest.raises(openai.BadRequestError) as exc:
                await client.embeddings.create(model=EMBED_MODEL, input=tokens)
        assert isinstance(exc.value.body, dict)
        assert exc.value.body["param"] == "input"
        assert "token-id input is not supported" in exc.value.body["message"]


class TestModels:
    async def test_list_and_retrieve(self, api_stack: ApiServer, tenants: TenantKeys) -> None:
        async with sdk(api_stack, tenants) as client:
            deadline = time.monotonic() + 30  # the worker publishes its catalogue as it starts
            ids: set[str] = set()
            while CHAT_MODEL not in ids and time.monotonic() < deadline:
                ids = {m.id async for m in client.models.list()}
                await asyncio.sleep(0.2)
            assert {CHAT_MODEL, EMBED_MODEL} <= ids
            chat = await client.models.retrieve("HuggingFaceTB/SmolLM2-135M-Instruct")
            with pytest.raises(openai.NotFoundError) as missing:
                await client.models.retrieve("no-such-model")
        assert chat.id == CHAT_MODEL
        assert chat.object == "model"
        assert chat.to_dict()["served"] == ["local"]
        assert isinstance(missing.value.body, dict)
        assert missing.value.body["code"] == "model_not_found"

    async def test_models_need_a_key(self, api_stack: ApiServer) -> None:
        async with openai.AsyncOpenAI(
            base_url=f"{api_stack.url}/v1", api_key="wrong", max_retries=0
        ) as client:
            with pytest.raises(openai.AuthenticationError) as refused:
                await client.models.list()
        assert refused.value.request_id and refused.value.request_id.startswith("req_")


class TestBatchErrorsMatchTheSyncApi:
    def test_unknown_model_line_has_the_sync_error_type(self) -> None:
        result = json.dumps({"error": {"type": "model_not_found", "message": "no backend serves 'x'"}})
        ok, line = output_line("batch_1", 0, Entry("c-0", "job_abc", None), "failed", result, "completed")
        response = json.loads(line)["response"]
        assert not ok and response["status_code"] == 404
        assert response["request_id"] == "job_abc"
        assert response["body"]["error"]["type"] == "not_found_error"

    def test_bad_body_line_carries_a_request_id_and_param(self) -> None:
        error = {"code": "invalid_request", "message": "input: input[0] is empty", "param": "input"}
        ok, line = output_line("batch_1", 3, Entry("c-3", None, error), None, None, "completed")
        parsed = json.loads(line)
        assert not ok and parsed["response"]["status_code"] == 400
        assert parsed["response"]["request_id"] == parsed["id"]
        assert parsed["response"]["body"]["error"]["param"] == "input"

    async def test_cancelling_a_cancelled_batch_is_409(
        self, request: pytest.FixtureRequest, tenants: TenantKeys
    ) -> None:
        stack: BatchStack = request.getfixturevalue("idle_stack")  # an API with no worker
        lines = [
            embed_line(0, tag="k"),
            {**embed_line(1, tag="k"), "body": {"model": "fixed-cost", "input": ""}},
        ]
        async with stack.sdk(tenants) as client:
            batch = await run_batch(client, jsonl(lines))
            await wait_for_submitted(client, batch.id, 1)
            first = await client.batches.cancel(batch.id)
            done = await wait_batch(client, batch.id, timeout=30)
            with pytest.raises(openai.ConflictError) as again:
                await client.batches.cancel(batch.id)
            errors = {e["custom_id"]: e for e in await full_lines(client, done.error_file_id)}
        assert first.status in ("cancelling", "cancelled") and done.status == "cancelled"
        assert isinstance(again.value.body, dict) and again.value.body["code"] == "batch_not_cancellable"
        bad = errors["k-1"]["response"]
        assert bad["status_code"] == 400 and bad["request_id"] == errors["k-1"]["id"]
        assert bad["body"]["error"]["param"] == "input"
        assert errors["k-0"]["error"]["code"] == "batch_cancelled"
