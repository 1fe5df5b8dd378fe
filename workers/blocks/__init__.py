"""Bulk chunks run as columns: one routing decision, texts batched as arrays, one stored value
per backend batch (``producer/contract/blocks.py``)."""

from .columns import ChunkColumns, decode_columns
from .runner import BlockRunner
from .writer import BlockWriter

__all__ = ["BlockRunner", "BlockWriter", "ChunkColumns", "decode_columns"]
