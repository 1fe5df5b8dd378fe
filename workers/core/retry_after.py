"""``Retry-After`` as seconds, for the remote's 429s and webhook receivers' answers alike."""

from __future__ import annotations

import email.utils
import math
import time


def retry_after_s(value: str | None, cap_s: float = math.inf, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date), capped; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), cap_s)
