"""``python -m services.edge``: the edge service (services/edge/cli.py)."""

from services.edge.cli import main

main()
