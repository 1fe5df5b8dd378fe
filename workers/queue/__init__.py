"""The queue side of a worker: arq's Worker changed for packages (one-script claims, leases,
wake-ups, fair share between tenants), and admission by the measured service rate.
"""

from .admission import Admission
from .shares import SharePublisher, share_map
from .worker import Backoff, PackageWorker

__all__ = (
    "Admission",
    "Backoff",
    "PackageWorker",
    "SharePublisher",
    "share_map",
)
