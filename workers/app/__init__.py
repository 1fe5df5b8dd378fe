"""A worker process: its settings root, its model catalogue, and ``main``."""

from .catalogue import model_cards, publish_catalogue
from .main import main
from .settings import Settings

__all__ = (
    "Settings",
    "main",
    "model_cards",
    "publish_catalogue",
)
