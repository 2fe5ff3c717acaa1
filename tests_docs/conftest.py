"""The documentation run as written: every fenced block of README.md and docs/, the fleet script twice in
one dir, each crontab line under cron's bare environment, the wheel install commands in a fresh venv.

These run after the main suite (`.ci/run`), with its set-up: `python -m pytest -q -n 2 tests_docs`. They
share the main suite's fixtures (the moto S3 server, the kernel cache, hypothesis' CI profile, --run-slow).
"""

from tests.conftest import (  # noqa: F401  (fixtures and hooks, by name)
    pytest_addoption,
    pytest_collection_modifyitems,
    s3_env,
    s3_server,
)
