"""``python -m services.verifier``: the verifier service (services/verifier/cli.py)."""

from services.verifier.cli import main

main()
