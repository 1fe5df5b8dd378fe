"""``python -m producer.api``: run the HTTP API server.

SIGTERM ends the process with status 0 once the drain is over: uvicorn shuts down gracefully,
then delivers the signal again to the handler it found, this one, which exits cleanly instead
of dying by the signal (a signal death reads as a crash to a supervisor). Before uvicorn runs,
the same handler makes a SIGTERM during start-up a clean stop too.
"""

import signal
import sys
from types import FrameType

from .app import main


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)


signal.signal(signal.SIGTERM, _exit_cleanly)
main()
