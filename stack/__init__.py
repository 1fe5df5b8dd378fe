"""Launches the whole system as processes; sits above ``producer`` and ``workers``."""

from .processes import ManagedProcess, StartError, free_port
from .stack import Stack, StackSettings

__all__ = ("ManagedProcess", "Stack", "StackSettings", "StartError", "free_port")
