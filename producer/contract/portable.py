"""What the wire can carry: a value JSON accepts is not always one Redis, msgpack and Lua can.

Python's JSON parser accepts lone surrogates (``"\\ud800"``), integers of any size and nesting
as deep as its stack; msgpack (work packages) refuses the first two, and a job record that
cannot be written fails every job packed with it. So every value from outside is checked
once, at the edge, before it is queued: :func:`portable_problem` says what is wrong, or None.
"""

from __future__ import annotations

import math
from typing import Any

MAX_DEPTH = 64  # nesting levels of objects and arrays in one value
INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # msgpack's integer range


class _Problem(Exception):
    def __init__(self, why: str) -> None:
        self.why = why
        self.path: list[str] = []


def printable(text: str) -> str:
    """``text`` safe to echo in an error (lone surrogates escaped)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def portable_problem(value: Any, where: str = "body") -> str | None:
    """None if ``value`` survives JSON, msgpack and Lua unchanged; else ``"path: why"``."""
    try:
        _walk(value, 0)
    except _Problem as problem:
        path = ".".join([where, *reversed(problem.path)])
        return f"{printable(path)}: {problem.why}"
    return None


def _walk(value: Any, depth: int) -> None:
    kind = type(value)
    if kind is str:
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _Problem("string is not valid Unicode (a lone surrogate)") from None
    elif kind is dict:
        if depth >= MAX_DEPTH:
            raise _Problem(f"nested deeper than {MAX_DEPTH} levels")
        for key, item in value.items():
            try:
                _walk(key, depth)
                _walk(item, depth + 1)
            except _Problem as problem:
                problem.path.append(str(key))
                raise
    elif kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            raise _Problem(f"nested deeper than {MAX_DEPTH} levels")
        for index, item in enumerate(value):
            try:
                _walk(item, depth + 1)
            except _Problem as problem:
                problem.path.append(str(index))
                raise
    elif kind is int:
        if not INT_MIN <= value <= INT_MAX:
            raise _Problem("integer out of the 64-bit range")
    elif kind is float:
        if not math.isfinite(value):
            raise _Problem("number must be finite")
