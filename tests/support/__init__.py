"""What the tests share besides fixtures: paths, sandbox limits, how long a test waits (patience.py),
bundle variants, catalog helpers, a scripted OpenAI-compatible server, and the test-tier plugin.
Fixtures live in tests/conftest.py."""
