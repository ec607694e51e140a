"""The FERROKERAS_* environment variables: read once per process (`src/base/config.rs`,
`python/ferrokeras/config.py`), a bad value is a ValueError naming the variable, and
`docs/env_vars.md` lists exactly the variables the code reads."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from ferrokeras import backend as K

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints the type and message of the exception the statement raises, or "ok".
_PROBE = """
import ferrokeras.backend as K
try:
    {stmt}
    print("ok")
except Exception as e:
    print(type(e).__name__, e)
"""


def _probe(stmt, **env):
    r = subprocess.run(
        [sys.executable, "-c", _PROBE.format(stmt=stmt)],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "name, value",
    [
        ("FERROKERAS_CPU_FUSION", "maybe"),
        ("FERROKERAS_CPU_INPLACE", "2"),
        ("FERROKERAS_LOOP_OPT", "hoist"),
        ("FERROKERAS_LOOP_DEBUG", "verbose"),
        ("FERROKERAS_GPU_LOOPS", "sometimes"),
        ("FERROKERAS_REQUIRE_GPU", "yes please"),
        ("FERROKERAS_GPU_MAX_BINDING", "64k"),
        ("FERROKERAS_GPU_POOL_MAX_IDLE_MB", "-1"),
        ("FERROKERAS_GPU_POOL_MAX_IDLE_SUBMITS", "1e3"),
    ],
)
def test_a_bad_value_is_a_value_error_naming_the_variable(name, value):
    out = _probe("K.eval(K.constant([1.0, 2.0]) * 2)", **{name: value})
    assert out.startswith(f"ValueError {name} must be"), out
    assert repr(value) in out or f'"{value}"' in out, out


def test_a_bad_value_is_reported_when_a_loop_is_built():
    """Loop building reads the configuration before any device is used."""
    stmt = "K.rnn(lambda x, s: (x, [s[0] + x]), K.zeros((2, 3, 4)), [K.zeros((2, 4))])"
    out = _probe(stmt, FERROKERAS_LOOP_OPT="sometimes")
    assert out.startswith("ValueError FERROKERAS_LOOP_OPT must be 0 or 1"), out


def test_good_values_run():
    env = dict(
        FERROKERAS_CPU_FUSION="0",
        FERROKERAS_CPU_INPLACE="off",
        FERROKERAS_LOOP_OPT="1",
        FERROKERAS_GPU_POOL_MAX_IDLE_MB="3",
    )
    assert _probe("print(K.eval(K.constant([1.0, 2.0]) * 2))", **env) == "ok"


def test_read_once_per_process(monkeypatch):
    """A value set after the first call has no effect, not even a bad one."""
    assert K.eval(K.constant(1.0) + 1) == 2
    monkeypatch.setenv("FERROKERAS_CPU_FUSION", "maybe")
    np.testing.assert_array_equal(K.eval(K.constant([1.0, 2.0]) * 3), [3.0, 6.0])


def _names(text):
    return set(re.findall(r"FERROKERAS_[A-Z0-9_]*[A-Z0-9]", text))


def test_docs_list_exactly_the_variables_the_code_reads():
    read = set()
    for top in ("src", "python", "benches"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith((".rs", ".py")):
                    with open(os.path.join(d, f), encoding="utf-8") as fh:
                        read |= _names(fh.read())
    with open(os.path.join(ROOT, "docs", "env_vars.md"), encoding="utf-8") as fh:
        documented = {
            m.group(1)
            for m in re.finditer(r"^\| `(FERROKERAS_[A-Z0-9_]+)`", fh.read(), re.MULTILINE)
        }
    assert read == documented, (sorted(read - documented), sorted(documented - read))
