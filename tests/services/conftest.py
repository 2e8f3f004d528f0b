from tests.services.harness import spawn  # noqa: F401  (a fixture)
