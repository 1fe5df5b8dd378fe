"""Chat and rerank jobs on the real local models, in the OpenAI / Cohere shapes."""

from __future__ import annotations

import asyncio

from producer import Client

CHAT = "SmolLM2-135M-Instruct"
RERANK = "minilm-l6-cosine-rerank"
SYSTEM = {"role": "system", "content": "You are a concise assistant."}


def chat_body(question: str, **extra: object) -> dict[str, object]:
    return {
        "model": CHAT,
        "messages": [SYSTEM, {"role": "user", "content": question}],
        "max_tokens": 12,
        **extra,
    }


async def test_a_chat_job_returns_an_openai_chat_completion(session_client: Client) -> None:
    job = await session_client.submit("chat", chat_body("What is the capital of France?", temperature=0))
    result = await session_client.wait(job, timeout=120)
    assert result.status == "succeeded", result.error
    body = result.body
    assert body is not None and body["object"] == "chat.completion" and body["model"] == CHAT
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 10 and 0 < usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_greedy_chat_is_deterministic_and_batched(session_client: Client) -> None:
    questions = ["Name a colour.", "Name a fruit.", "Name a planet.", "Name a metal."]
    bodies = [chat_body(q, temperature=0) for q in questions] * 2
    ids = await asyncio.gather(*(session_client.submit("chat", b) for b in bodies))
    results = await session_client.wait_many(ids, timeout=180)
    texts = [r.body["choices"][0]["message"]["content"] for r in results]
    assert texts[:4] == texts[4:], "the same greedy request gives the same text"
    assert max(r.timings.batch_size for r in results) > 1, "concurrent chats share a Triton request"


async def test_max_tokens_ends_with_length(session_client: Client) -> None:
    job = await session_client.submit(
        "chat", chat_body("Count from one to fifty in words.", max_tokens=3, temperature=0)
    )
    result = await session_client.wait(job, timeout=60)
    assert result.body["choices"][0]["finish_reason"] == "length"
    assert result.body["usage"]["completion_tokens"] == 3


async def test_a_bad_chat_fails_alone(session_client: Client) -> None:
    good = [session_client.submit("chat", chat_body(f"Say {w}.", temperature=0)) for w in ("yes", "no")]
    bad = session_client.submit(
        "chat", {"model": CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, validate=False
    )
    ids = await asyncio.gather(bad, *good)
    results = await session_client.wait_many(ids, timeout=120)
    assert results[0].status == "failed" and results[0].error.type == "invalid_request"
    assert "role" in results[0].error.message
    assert [r.status for r in results[1:]] == ["succeeded", "succeeded"]


async def test_rerank_puts_the_relevant_documents_first(session_client: Client) -> None:
    documents = [
        "The museum opens at nine and closes at five on weekdays.",
        "To reset your password, open Settings, choose Security and click 'Forgot password'.",
        "Our bakery sells sourdough bread every morning.",
        {"text": "If you forgot your password, use the reset link we email to you."},
        "The football match was postponed because of rain.",
    ]
    body = {"model": RERANK, "query": "how do I reset my password", "documents": documents, "top_n": 3,
            "return_documents": True}  # fmt: skip
    result = await session_client.wait(await session_client.submit("rerank", body), timeout=60)
    assert result.status == "succeeded"
    ranked = result.body["results"]
    assert len(ranked) == 3
    assert {ranked[0]["index"], ranked[1]["index"]} == {1, 3}
    scores = [r["relevance_score"] for r in ranked]
    assert scores == sorted(scores, reverse=True)
    assert ranked[0]["document"]["text"] in (documents[1], documents[3]["text"])  # type: ignore[index]
    assert result.body["usage"]["total_tokens"] > 0 and result.model == RERANK


async def test_a_hundred_document_rerank_is_batched(session_client: Client) -> None:
    docs = [f"Document {i} talks about topic {i % 9}." for i in range(100)]
    job = await session_client.submit("rerank", {"model": RERANK, "query": "topic 3", "documents": docs})
    result = await session_client.wait(job, timeout=60)
    assert result.status == "succeeded" and len(result.body["results"]) == 100
    assert result.timings.batch_size >= 64, "100 pairs travel in Triton requests of up to 128"
