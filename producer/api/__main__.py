"""``python -m producer.api``: run the HTTP API server."""

from .app import main

main()
