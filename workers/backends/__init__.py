"""Where jobs run: the answer types every backend shares, the response bodies, and the
backends themselves (``local/`` Triton, ``remote/`` OpenAI-compatible APIs).
"""

from .base import Answer, ChatDelta, ChatOutput, ChatStreamer
from .bodies import chat_body, chat_params, embedding_body, encode_vector, rerank_body, response_id

__all__ = (
    "Answer",
    "ChatDelta",
    "ChatOutput",
    "ChatStreamer",
    "chat_body",
    "chat_params",
    "embedding_body",
    "encode_vector",
    "rerank_body",
    "response_id",
)
