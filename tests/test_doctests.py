"""Every ``>>>`` example in the docstrings of the ``ferrokeras`` package runs as a doctest, on
the device of this pass (``make test`` runs the suite once per device).

The examples are the documentation users copy; a stale one fails here.
"""

import doctest
import importlib
import pkgutil

import ferrokeras
import numpy as np
import pytest


def _modules():
    names = ["ferrokeras"]
    for info in pkgutil.walk_packages(ferrokeras.__path__, "ferrokeras."):
        if info.name != "ferrokeras._core":
            names.append(info.name)
    return names


def _examples():
    finder = doctest.DocTestFinder(exclude_empty=True)
    cases = []
    for name in _modules():
        module = importlib.import_module(name)
        for test in finder.find(module, name):
            if test.examples:
                cases.append(pytest.param(test, id=test.name))
    return cases


EXAMPLES = _examples()


def test_the_package_has_examples():
    assert len(EXAMPLES) > 100


@pytest.mark.parametrize("test", EXAMPLES)
def test_docstring_example(test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    globs = dict(test.globs)
    globs.setdefault("np", np)
    test.globs = globs
    out = []
    result = runner.run(test, out=out.append)
    assert result.failed == 0, "".join(out)
