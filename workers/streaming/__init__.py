"""Streamed chat: the hub that writes deltas to the jobs' Redis Streams, and a streamed job
run over its sources with failover before the first token and resume after a crash."""

from .chat import Resume, Source, StreamedChat, close_stream, conversation
from .hub import JobStream, StreamHub

__all__ = ("JobStream", "Resume", "Source", "StreamHub", "StreamedChat", "close_stream", "conversation")
