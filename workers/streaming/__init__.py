"""Streamed chat: the hub that writes deltas to the jobs' Redis Streams, and a streamed job
run over its backends with failover and resume.
"""

from .chat import Resume, Source, StreamedChat, conversation, local_source, remote_sources, stream_sources
from .hub import JobStream, StreamHub

__all__ = (
    "JobStream",
    "Resume",
    "Source",
    "StreamHub",
    "StreamedChat",
    "conversation",
    "local_source",
    "remote_sources",
    "stream_sources",
)
