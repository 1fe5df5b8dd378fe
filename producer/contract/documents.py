"""Configuration documents (the policy, the providers file): YAML or JSON in, one clear line
out when they do not parse or validate — where, and what is wrong, never a wall of branches."""

from __future__ import annotations

import json

import yaml
from pydantic import ValidationError


def parse_text(text: str | bytes, source: str, *, as_json: bool = False) -> object:
    """The document's data; ``ValueError`` names ``source`` and the first line of the reason."""
    try:
        return json.loads(text) if as_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{source}: does not parse: {str(exc).splitlines()[0]}") from None


def first_error(exc: ValidationError, top: str = "top level") -> str:
    """``where: what`` of a validation's first error, ``where`` a dotted path into the document."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or top
    return f"{where}: {first['msg']}"
