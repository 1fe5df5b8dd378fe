"""A bulk chunk's package decoded once into columns: its indices and inputs, and what they share.

A chunk runs as a block when all its jobs are of one kind and model and a block carries what
they return: embeddings of one text each, in one encoding (checked field by field: no model is
built per text); rerank jobs that do not ask for their documents back; chat jobs (parsed one by
one: a conversation costs far more than its parse). Any other chunk (several inputs per job, a
field a block does not carry, a body that does not parse) runs on the item path, job by job,
where each job's own errors are reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from producer.contract import (
    CHUNK_ID,
    HEADER_FIELDS,
    ChatRequest,
    InvalidBody,
    JobKind,
    Limits,
    RerankRequest,
    WorkItem,
    chunk_item_id,
    parse_body,
)

# The body fields a block carries: anything else (dimensions, a token-id input) is the item path's.
BLOCK_FIELDS = frozenset({"input", "model", "encoding_format", "user"})
ENCODINGS = ("float", "base64")
MAX_ROWS = 60_000  # a chunk's block numbers are 16-bit: one per backend batch, at most one per row


@dataclass(slots=True)
class ChunkColumns:
    chunk_id: str
    header: dict[str, Any]  # the package's shared fields, as they came
    entries: list[list[Any]]  # [index, body(, metadata)] as they came, to re-queue as they are
    indices: list[int]
    texts: list[str]  # embed: each job's text
    requests: list[Any]  # rerank, chat: each job's parsed request
    kind: JobKind
    model: str
    encoding: str

    def __len__(self) -> int:
        return len(self.indices)

    def sample(self) -> WorkItem:
        """The chunk's first job as a work item: what routing decides on for all of them."""
        base = {k: self.header[k] for k in HEADER_FIELDS if k in self.header}
        return WorkItem.model_validate(
            {**base, "id": chunk_item_id(self.chunk_id, self.indices[0]), "body": self.entries[0][1]}
        )

    def items(self, indices: set[int]) -> list[WorkItem]:
        """The jobs of ``indices`` as work items (for a re-queue, on the item path)."""
        base = {k: self.header[k] for k in HEADER_FIELDS if k in self.header}
        out = []
        for entry in self.entries:
            if entry[0] in indices:
                item = {**base, "id": chunk_item_id(self.chunk_id, entry[0]), "body": entry[1]}
                if len(entry) == 3:
                    item["metadata"] = entry[2]
                out.append(WorkItem.model_validate(item))
        return out


def decode_columns(payload: dict[str, Any], limits: Limits) -> ChunkColumns | None:
    """The chunk as columns, or None where it must run on the item path."""
    header, entries = payload.get("chunk"), payload.get("entries")
    if not isinstance(header, dict) or not isinstance(entries, list) or not 0 < len(entries) <= MAX_ROWS:
        return None
    chunk_id = header.get("id")
    if not isinstance(chunk_id, str) or CHUNK_ID.fullmatch(chunk_id) is None:
        return None
    if header.get("kind") in (JobKind.rerank.value, JobKind.chat.value):
        return _parsed(chunk_id, header, entries, JobKind(header["kind"]), limits)
    if header.get("kind") != JobKind.embed.value:
        return None
    first = entries[0][1] if isinstance(entries[0], list) and len(entries[0]) > 1 else None
    if not isinstance(first, dict):
        return None
    model, encoding = first.get("model"), first.get("encoding_format", "float")
    if not isinstance(model, str) or encoding not in ENCODINGS:
        return None
    indices: list[int] = []
    texts: list[str] = []
    seen: set[int] = set()
    for entry in entries:
        text = _text(entry, model, encoding, limits)
        if text is None or entry[0] in seen:
            return None
        seen.add(entry[0])
        indices.append(entry[0])
        texts.append(text)
    return ChunkColumns(chunk_id, header, entries, indices, texts, [], JobKind.embed, model, encoding)


def _parsed(
    chunk_id: str, header: dict[str, Any], entries: list[Any], kind: JobKind, limits: Limits
) -> ChunkColumns | None:
    """A chunk of rerank or chat jobs, each parsed by the contract's rules, or None."""
    indices: list[int] = []
    requests: list[Any] = []
    seen: set[int] = set()
    for entry in entries:
        if not isinstance(entry, list) or not 2 <= len(entry) <= 3 or type(entry[0]) is not int:
            return None
        try:
            request = parse_body(kind, entry[1], limits)
        except InvalidBody:
            return None
        if entry[0] < 0 or entry[0] in seen or not _carried(request):
            return None
        if requests and request.model != requests[0].model:
            return None
        seen.add(entry[0])
        indices.append(entry[0])
        requests.append(request)
    return ChunkColumns(chunk_id, header, entries, indices, [], requests, kind, requests[0].model, "float")


def _carried(request: Any) -> bool:
    """Does a block carry all this job returns? (Not rerank's documents, nor a stream.)"""
    if isinstance(request, RerankRequest):
        return not request.return_documents
    return isinstance(request, ChatRequest) and not request.stream


def _text(entry: Any, model: str, encoding: str, limits: Limits) -> str | None:
    """The entry's one text, if it is a job a block runs as it is."""
    if not isinstance(entry, list) or not 2 <= len(entry) <= 3:
        return None
    index, body = entry[0], entry[1]
    if type(index) is not int or index < 0 or not isinstance(body, dict) or not BLOCK_FIELDS.issuperset(body):
        return None
    text = body.get("input")
    if body.get("model") != model or body.get("encoding_format", "float") != encoding:
        return None
    if not isinstance(text, str) or not 0 < len(text) <= limits.max_input_chars or not text.strip():
        return None
    user = body.get("user")
    return text if user is None or isinstance(user, str) else None
