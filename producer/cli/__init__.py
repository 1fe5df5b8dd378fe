"""Producer commands: submit a job, read its status, wait for it, cancel it, run a bulk file.

Results go to stdout. Errors go to stderr as one JSON line ``{"error": {"type", "message"}}``
(a traceback only with ``--debug`` or ``OVERSPILL_DEBUG=1``), and the exit code says what
happened: :class:`Exit`, listed in every command's help.
"""

from .bulk import bulk
from .jobs import api_key, cancel, status, submit
from .reporting import EXIT_CODES_HELP, MEANINGS, CliError, Exit, command, debug_option
from .usage import usage

COMMANDS = [submit, status, cancel, api_key, bulk, usage]

__all__ = (
    "COMMANDS",
    "EXIT_CODES_HELP",
    "MEANINGS",
    "CliError",
    "Exit",
    "api_key",
    "bulk",
    "cancel",
    "command",
    "debug_option",
    "status",
    "submit",
    "usage",
)
