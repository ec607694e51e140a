"""switch, in_train_phase, in_test_phase and the symbolic/eager decorators.

The switch records give the condition and both branches as NumPy arrays and the
reference ``np.where`` with the condition aligned to the branches' leading axes (the
Theano/TF rule: a 1-D condition picks rows). Each record runs forward (float32, float64)
and through the finite-difference gradient check of the selected values.
"""

from dataclasses import dataclass

import numpy as np
import pytest
from ferrokeras import backend as K
from gradcheck import assert_mentions, check_grad, run


def aligned(cond, ndim):
    return cond.reshape(cond.shape + (1,) * (ndim - cond.ndim))


@dataclass(frozen=True)
class Case:
    name: str
    cond_shape: tuple
    expr_shape: tuple
    cond_dtype: str = "bool"

    def __repr__(self):
        return self.name


CASES = [
    Case("scalar_bool", (), (2, 3)),
    Case("scalar_int", (), (2, 3), "int32"),
    Case("scalar_float", (), (3,), "float32"),
    Case("same_shape", (2, 3), (2, 3)),
    Case("rows", (4,), (4, 3)),
    Case("rows_3d", (2,), (2, 3, 2)),
    Case("leading_2d", (2, 3), (2, 3, 4)),
    Case("int_elementwise", (5,), (5,), "int32"),
]


def _cond(case, rng):
    if case.cond_dtype == "bool":
        return rng.integers(0, 2, size=case.cond_shape).astype(bool)
    return rng.integers(-1, 2, size=case.cond_shape).astype(case.cond_dtype)  # non-zero is True


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_switch(case, dtype, rng):
    c = _cond(case, rng)
    a = rng.normal(size=case.expr_shape).astype(dtype)
    b = rng.normal(size=case.expr_shape).astype(dtype)
    pc = K.placeholder(shape=case.cond_shape, dtype=case.cond_dtype)
    pa = K.placeholder(shape=case.expr_shape, dtype=dtype)
    pb = K.placeholder(shape=case.expr_shape, dtype=dtype)
    out = K.switch(pc, pa, pb)
    assert K.int_shape(out) == case.expr_shape and K.dtype(out) == dtype
    ref = np.where(aligned(c != 0, a.ndim), a, b)
    value = run([pc, pa, pb], [out], [c, a, b])[0]
    np.testing.assert_array_equal(value, ref)
    # Callables give the same result.
    value = run([pc, pa, pb], [K.switch(pc, lambda: pa, lambda: pb)], [c, a, b])[0]
    np.testing.assert_array_equal(value, ref)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_switch_gradient(case, rng):
    c = _cond(case, rng)
    cond = K.constant(c, dtype=case.cond_dtype)
    check_grad(
        lambda a, b: K.switch(cond, a * a, b * 3.0),
        [rng.normal(size=case.expr_shape), rng.normal(size=case.expr_shape)],
    )


def test_switch_branch_not_taken_does_not_poison_the_gradient():
    # log(x) is NaN for x < 0 where the other branch is taken: the gradient there is the
    # other branch's, not NaN.
    x = K.variable(np.array([-2.0, 0.5, 3.0]), dtype="float64")
    y = K.switch(x > 0, K.log(x), x * 2.0)
    g = K.eval(K.gradients(K.sum(y), [x])[0])
    np.testing.assert_allclose(g, [2.0, 2.0, 1 / 3.0], rtol=1e-12)


def test_switch_python_condition_and_scalar_branches():
    x = K.constant([1.0, 2.0])
    np.testing.assert_array_equal(K.eval(K.switch(True, x, x * 0)), [1.0, 2.0])
    np.testing.assert_array_equal(K.eval(K.switch(0, x, x * 0)), [0.0, 0.0])
    np.testing.assert_array_equal(
        K.eval(K.switch(K.constant([True, False], dtype="bool"), x, 0.0)), [1.0, 0.0]
    )


def test_switch_condition_rank_too_high():
    with pytest.raises(ValueError) as excinfo:
        K.switch(
            K.placeholder(shape=(2, 3), dtype="bool"),
            K.placeholder(shape=(2,)),
            K.placeholder(shape=(2,)),
        )
    assert_mentions(excinfo, "rank", "condition")


def test_switch_dtype_mismatch():
    with pytest.raises(TypeError) as excinfo:
        K.switch(
            K.constant(True, dtype="bool"),
            K.placeholder(shape=(2,)),
            K.placeholder(shape=(2,), dtype="float64"),
        )
    assert_mentions(excinfo, "dtype")


# ---- learning phase -----------------------------------------------------------------------------

PHASE_FUNCS = [
    # (name, fn, which argument it returns in the train phase)
    ("in_train_phase", K.in_train_phase, 0),
    ("in_test_phase", K.in_test_phase, 1),
]


@pytest.mark.parametrize("name,fn,train_arg", PHASE_FUNCS, ids=[p[0] for p in PHASE_FUNCS])
def test_phase_with_the_learning_phase_placeholder(name, fn, train_arg, rng):
    a = rng.normal(size=(3, 2)).astype("float32")
    x = K.placeholder(shape=(None, 2))
    branches = (x * 2.0, x - 1.0)
    refs = (a * 2.0, a - 1.0)
    out = fn(*branches)
    assert out._uses_learning_phase
    f = K.function([x, K.learning_phase()], [out])
    np.testing.assert_allclose(f([a, 1])[0], refs[train_arg], rtol=1e-6)
    np.testing.assert_allclose(f([a, 0])[0], refs[1 - train_arg], rtol=1e-6)
    np.testing.assert_allclose(f([a, True])[0], refs[train_arg], rtol=1e-6)
    # Not fed: the learning phase reads 0 (test).
    np.testing.assert_allclose(run([x], [out], [a])[0], refs[1 - train_arg], rtol=1e-6)


@pytest.mark.parametrize("name,fn,train_arg", PHASE_FUNCS, ids=[p[0] for p in PHASE_FUNCS])
@pytest.mark.parametrize(
    "training,is_train", [(True, 1), (1, 1), (False, 0), (0, 0), (np.int64(1), 1)], ids=str
)
def test_phase_with_a_python_flag(name, fn, train_arg, training, is_train):
    # A Python flag picks the expression itself; callables are called.
    x, alt = K.constant([1.0]), K.constant([2.0])
    chosen = (x, alt)[train_arg if is_train else 1 - train_arg]
    assert fn(x, alt, training=training) is chosen
    assert fn(lambda: x, lambda: alt, training=training) is chosen


@pytest.mark.parametrize("name,fn,train_arg", PHASE_FUNCS, ids=[p[0] for p in PHASE_FUNCS])
def test_phase_with_a_tensor_flag(name, fn, train_arg, rng):
    a = rng.normal(size=(4,)).astype("float32")
    x = K.placeholder(shape=(4,))
    flag = K.placeholder(shape=(), dtype="int32")
    out = fn(lambda: x + 1.0, lambda: x * 0.0, training=flag)
    assert not getattr(out, "_uses_learning_phase", False)
    refs = (a + 1.0, a * 0.0)
    np.testing.assert_allclose(run([x, flag], [out], [a, 1])[0], refs[train_arg], rtol=1e-6)
    np.testing.assert_allclose(run([x, flag], [out], [a, 0])[0], refs[1 - train_arg], rtol=1e-6)


def test_set_learning_phase_fixes_the_choice():
    x, alt = K.constant([1.0]), K.constant([2.0])
    try:
        K.set_learning_phase(1)
        assert K.in_train_phase(x, alt) is x
        assert K.in_test_phase(x, alt) is alt
        K.set_learning_phase(0)
        assert K.in_train_phase(x, alt) is alt
    finally:
        K.clear_session()


def test_phase_gradient_flows_through_the_selected_branch(rng):
    a = rng.normal(size=(3,))
    x = K.placeholder(shape=(3,), dtype="float64")
    out = K.in_train_phase(x * x, x * 3.0)
    g = K.gradients(K.sum(out), [x])[0]
    f = K.function([x, K.learning_phase()], [g])
    np.testing.assert_allclose(f([a, 1])[0], 2 * a, rtol=1e-12)
    np.testing.assert_allclose(f([a, 0])[0], np.full(3, 3.0), rtol=1e-12)


def test_phase_rejects_bad_training():
    with pytest.raises(TypeError) as excinfo:
        K.in_train_phase(K.constant(1.0), K.constant(2.0), training="yes")
    assert_mentions(excinfo, "training")
    with pytest.raises(ValueError) as excinfo:
        K.in_train_phase(K.constant(1.0), K.constant(2.0), training=K.placeholder(shape=(2,)))
    assert_mentions(excinfo, "training", "scalar")


def test_symbolic_and_eager_return_the_function():
    def f(x):
        return x + 1

    assert K.symbolic(f) is f and K.eager(f) is f
