"""Every name in tests/data/api.tsv (the documented API table) is exported by ferrokeras.backend with its documented
signature: the documented parameters come first, in order, with the documented defaults;
any further parameter has a default (so documented calls keep working).

Names nobody has implemented yet are expected failures with the issue that delivers them
(strict, so the marker has to go when they land).
"""

import ast
import inspect

import pytest
from api_table import ROWS
from ferrokeras import backend as K

PENDING = {}  # name -> the issue that delivers it, while it is not implemented


def _documented(sig):
    """(params, var_keyword) of a documented signature: params are (name, default) with
    inspect.Parameter.empty for required ones."""
    args = ast.parse(f"def f({sig}): pass").body[0].args
    names = [a.arg for a in args.args]
    defaults = [ast.literal_eval(d) for d in args.defaults]
    defaults = [inspect.Parameter.empty] * (len(names) - len(defaults)) + defaults
    return list(zip(names, defaults)), args.kwarg is not None


def _param(name, sig):
    marks = [pytest.mark.xfail(strict=True, reason=PENDING[name])] if name in PENDING else []
    return pytest.param(name, sig, id=name, marks=marks)


def test_the_table_is_complete():
    assert len(ROWS) == 149


@pytest.mark.parametrize("name,sig", [_param(n, s) for n, s in ROWS])
def test_exported_with_documented_signature(name, sig):
    fn = getattr(K, name, None)
    assert fn is not None, f"ferrokeras.backend has no {name}"
    assert callable(fn)
    assert not getattr(fn, "_ferrokeras_missing", False), f"K.{name} is a not-implemented stub"
    params = list(inspect.signature(fn).parameters.values())
    documented, var_kw = _documented(sig)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert [p.name for p in positional[: len(documented)]] == [n for n, _ in documented], (
        f"K.{name}{inspect.signature(fn)} does not start with the documented ({sig})"
    )
    for p, (n, default) in zip(positional, documented):
        if default is inspect.Parameter.empty:
            assert p.default is inspect.Parameter.empty, f"K.{name}: {n} should be required"
        else:
            assert p.default == default and type(p.default) is type(default), (
                f"K.{name}: default of {n} is {p.default!r}, documented {default!r}"
            )
    for p in positional[len(documented) :]:
        assert p.default is not inspect.Parameter.empty, (
            f"K.{name}: extra parameter {p.name} needs a default"
        )
    for p in params:
        if p.kind == p.KEYWORD_ONLY:
            assert p.default is not inspect.Parameter.empty, (
                f"K.{name}: keyword {p.name} needs a default"
            )
    if var_kw:
        assert any(p.kind == p.VAR_KEYWORD for p in params), f"K.{name} should take **kwargs"
