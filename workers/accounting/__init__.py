"""What jobs used and cost (the ledger) and the tenants' remote budgets."""

from .budgets import BudgetConfig, Budgets
from .ledger import Ledger, gpu_share_s, items_of, tokens_of

__all__ = (
    "BudgetConfig",
    "Budgets",
    "Ledger",
    "gpu_share_s",
    "items_of",
    "tokens_of",
)
