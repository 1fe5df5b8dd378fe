"""A worker process: its settings root, its model catalogue, and ``main``."""

from .catalogue import model_cards, publish_catalogue
from .main import main

__all__ = (
    "main",
    "model_cards",
    "publish_catalogue",
)
