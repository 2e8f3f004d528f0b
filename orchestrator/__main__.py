"""`python -m orchestrator`: the dsdbed command line."""

from orchestrator.cli import main

raise SystemExit(main())
