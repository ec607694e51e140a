"""Runs tests in a child process with some environment variables set: the core reads its
``FERROKERAS_*`` variables once per process (``src/base/config.rs``), so a test of another
setting runs there."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_is(name, value):
    """Whether this process runs with ``name`` set to ``value``."""
    return os.environ.get(name, "").strip() == value


def pytest_in_child(env, *args, timeout=600):
    """Runs ``pytest args`` with ``env`` added to this process's environment; fails with the
    end of the child's output unless it passes. Returns its output."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, (
        f"pytest {' '.join(args)} with {env}:\n{r.stdout[-4000:]}{r.stderr[-2000:]}"
    )
    return r.stdout
