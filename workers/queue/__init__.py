"""The queue side of a worker: arq's Worker changed for packages (one-script claims, leases,
wake-ups), and admission by the measured service rate.
"""

from .admission import Admission
from .worker import Backoff, PackageWorker

__all__ = (
    "Admission",
    "Backoff",
    "PackageWorker",
)
