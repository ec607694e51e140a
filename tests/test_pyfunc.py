"""py_function and print_tensor: host callbacks inside compiled graphs."""

import numpy as np
import pytest
from ferrokeras import backend as K


def log_huber(x, m):
    if K.abs(x) <= m:
        return x**2
    return m**2 * (1 - 2 * K.log(m) + K.log(x**2))


def test_log_huber_spec_example():
    # golden values from the tf.py_function document (spec tf_py_function.md): y = 1.0, dy/dx = 2.0
    x = K.placeholder(shape=())
    m = K.placeholder(shape=())
    y = K.py_function(func=log_huber, inp=[x, m], Tout="float32")
    dy_dx = K.gradients(y, [x])[0]
    y_v, g_v = K.function([x, m], [y, dy_dx])([1.0, 2.0])
    assert float(y_v) == 1.0 and float(g_v) == 2.0


@pytest.mark.parametrize("xv", [0.5, 3.0, -4.0])
def test_log_huber_both_branches_match_numpy(xv):
    x = K.placeholder(shape=(), dtype="float64")
    m = K.placeholder(shape=(), dtype="float64")
    y = K.py_function(log_huber, [x, m], "float64")
    gx, gm = K.gradients(y, [x, m])
    got = K.function([x, m], [y, gx, gm])([xv, 2.0])
    mv = 2.0
    if abs(xv) <= mv:
        want = (xv**2, 2 * xv, 0.0)
    else:
        want = (
            mv**2 * (1 - 2 * np.log(mv) + np.log(xv**2)),
            mv**2 * 2 / xv,
            2 * mv * (1 - 2 * np.log(mv) + np.log(xv**2)) - 2 * mv,
        )
    np.testing.assert_allclose([float(g) for g in got], want, rtol=1e-12)


def test_several_results_and_arrays(rng):
    a = rng.normal(size=(3, 4))
    x = K.placeholder(shape=(None, 4), dtype="float64")

    def f(t):
        return [K.sum(t * t, axis=1), np.asarray(t).max()]

    s, mx = K.py_function(f, [x], ["float64", "float64"])
    gs = K.gradients(K.sum(s) + mx, [x])[0]
    s_v, mx_v, g_v = K.function([x], [s, mx, gs])([a])
    np.testing.assert_allclose(s_v, (a * a).sum(1), rtol=1e-12)
    np.testing.assert_allclose(mx_v, a.max())
    # the NumPy result is not differentiable: only K ops contribute
    np.testing.assert_allclose(g_v, 2 * a, rtol=1e-12)


def test_exception_surfaces_with_original_type_and_variables_untouched():
    v = K.variable(np.array([1.0, 2.0]))
    x = K.placeholder(shape=())

    def boom(t):
        raise KeyError("no such key")

    y = K.py_function(boom, [x], "float32")
    f = K.function([x], [y], updates=[K.update_add(v, [1.0, 1.0])])
    with pytest.raises(KeyError, match="no such key"):
        f([1.0])
    np.testing.assert_array_equal(K.get_value(v), [1.0, 2.0])


def test_tout_mismatch_is_a_type_error():
    x = K.placeholder(shape=())
    y = K.py_function(lambda t: [t, t], [x], "float32")
    with pytest.raises(TypeError, match="Tout"):
        K.function([x], [y])([1.0])
    with pytest.raises(TypeError):
        K.py_function("not callable", [x], "float32")


def test_print_tensor_prints_and_passes_gradient(capsys):
    x = K.variable(np.array([1.0, 2.0]))
    p = K.print_tensor(x, message="x is:")
    g = K.gradients(K.sum(p * p), [x])[0]
    out = K.function([], [p, g])([])
    np.testing.assert_array_equal(out[0], [1.0, 2.0])
    np.testing.assert_array_equal(out[1], [2.0, 4.0])
    assert capsys.readouterr().out == "x is: [1. 2.]\n"


def test_print_tensor_separates_message_and_value_with_a_space(capsys):
    # TensorFlow's tf.print(message, x) and Theano's Print write "msg [[1.]]".
    K.eval(K.print_tensor(K.constant([[1.0]]), "msg"))
    assert capsys.readouterr().out == "msg [[1.]]\n"


def test_exported_from_package():
    import ferrokeras

    assert ferrokeras.py_function is K.py_function
