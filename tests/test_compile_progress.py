"""K.function reports a slow first call (the call that compiles the plan's kernels) on
stderr, unless verbose=0 or FERROKERAS_COMPILE_PROGRESS=0. A Python callback that sleeps
inside the graph stands in for a long compile."""

import io
import sys
import time

import numpy as np
import pytest
from ferrokeras import backend as K


def _slow_function(seconds, **kwargs):
    x = K.placeholder(shape=(None, 2))

    def slow(a):
        time.sleep(seconds)
        return a

    return K.function([x], [K.py_function(slow, [x], "float32") * 2], **kwargs)


FEED = [np.ones((1, 2), "float32")]


def test_slow_first_call_reports_progress(capsys, monkeypatch):
    monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "0.1")
    f = _slow_function(0.5, name="train_function")
    out = f(FEED)
    np.testing.assert_array_equal(out[0], [[2.0, 2.0]])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("ferrokeras:")]
    assert lines[0].startswith(
        "ferrokeras: compiling and running the first call of K.function 'train_function': "
    )
    assert lines[0].endswith("s so far")
    # Reports at 0.1 s, 0.2 s, 0.4 s (doubling; fewer when the machine is busy), then the total.
    assert 1 <= len(lines) - 1 <= 3
    assert all(ln.endswith(" s so far") for ln in lines[:-1])
    assert lines[-1].startswith("ferrokeras: compiling and running the first call")
    total = float(lines[-1].rsplit("done in ", 1)[1].split()[0])
    assert 0.4 <= total < 5
    # Later calls are not watched.
    f(FEED)
    assert capsys.readouterr().err == ""


def test_fast_first_call_is_silent(capsys, monkeypatch):
    monkeypatch.delenv("FERROKERAS_COMPILE_PROGRESS", raising=False)
    x = K.placeholder(shape=(None, 2))
    K.function([x], [x + 1])(FEED)
    assert "ferrokeras:" not in capsys.readouterr().err


@pytest.mark.parametrize("how", ["verbose", "env"])
def test_progress_can_be_turned_off(capsys, monkeypatch, how):
    if how == "verbose":
        monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "0.05")
        f = _slow_function(0.3, verbose=0)
    else:
        monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "0")
        f = _slow_function(0.3)
    f(FEED)
    assert "ferrokeras:" not in capsys.readouterr().err


def test_failed_first_call_reports_and_the_next_call_is_watched_again(capsys, monkeypatch):
    monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "0.05")
    x = K.placeholder(shape=(None, 2))
    fail = [False]

    def slow_then_fail(a):
        time.sleep(0.2)
        if fail[0]:
            raise KeyError("first")
        return a

    f = K.function([x], [K.py_function(slow_then_fail, [x], "float32")])
    fail[0] = True
    with pytest.raises(KeyError):
        f(FEED)
    assert "done in" in capsys.readouterr().err
    fail[0] = False
    f(FEED)
    assert "done in" in capsys.readouterr().err


def test_bad_settings_raise(monkeypatch):
    x = K.placeholder(shape=(2,))
    with pytest.raises(TypeError, match="verbose"):
        K.function([x], [x], verbose="loud")
    monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "fast")
    with pytest.raises(ValueError, match="FERROKERAS_COMPILE_PROGRESS"):
        K.function([x], [x])
    monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "-1")
    with pytest.raises(ValueError, match="FERROKERAS_COMPILE_PROGRESS"):
        K.function([x], [x])


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_one_line_is_rewritten(monkeypatch):
    monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "0.1")
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    _slow_function(1.4, name="f")(FEED)
    text = term.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    frames = text.rstrip("\n").split("\r")[1:]
    what = "ferrokeras: compiling and running the first call of K.function 'f'"
    # Rewritten once a second (at 0.1 s and 1.1 s), then the total.
    assert 1 <= len(frames) - 1 <= 2
    seconds = [int(f.rsplit(": ", 1)[1][: -len(" s")]) for f in frames[:-1]]
    assert all(f == f"{what}: {n} s" for f, n in zip(frames, seconds))
    assert seconds == sorted(seconds) and seconds[-1] <= 1
    assert frames[-1].startswith(f"{what}: done in 1.")


def _wide_graph(n):
    """n branches of a placeholder times a variable, concatenated and summed: the gradient
    and the plan take tens of milliseconds or more to build (4000 branches on a loaded
    2-vCPU VM: differentiating 0.05 s, planning 0.4 s)."""
    x = K.placeholder(shape=(None, 2))
    w = K.variable(np.ones((2,), "float32"))
    ys = [K.tanh(x * w * (1.0 + k * 1e-3)) for k in range(n)]
    return x, w, K.sum(K.concatenate(ys, axis=1))


def test_planning_and_differentiating_report_their_phase(capsys, monkeypatch):
    # Planning and differentiating run without the GIL: the reporting thread writes while
    # they run, and reads the phase the engine is in.
    monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "0.005")
    x, w, loss = _wide_graph(4000)
    capsys.readouterr()
    (g,) = K.gradients(loss, [w])
    # Each report names the phase the engine is in when the reporting thread wakes (none
    # between phases); on a loaded machine it may wake late, so a report may name a later
    # phase of the same job.
    err = capsys.readouterr().err.splitlines()
    assert len(err) >= 2 and err[0].startswith("ferrokeras: K.gradients: ")
    assert all(e.endswith((" s so far (differentiating)", " s so far")) for e in err[:-1]), err
    assert any(e.endswith(" s so far (differentiating)") for e in err[:-1]), err
    assert err[-1].startswith("ferrokeras: K.gradients: done in ")
    K.function([x], [loss, g], name="big")
    err = capsys.readouterr().err.splitlines()
    assert len(err) >= 2 and err[0].startswith("ferrokeras: planning K.function 'big': ")
    planning = (" s so far (optimising the graph)", " s so far (scheduling kernels)")
    assert all(e.endswith((*planning, " s so far")) for e in err[:-1]), err
    assert any(e.endswith(planning) for e in err[:-1]), err
    assert err[-1].startswith("ferrokeras: planning K.function 'big': done in ")
    # Off: nothing.
    K.function([x], [loss, g], verbose=0)
    monkeypatch.setenv("FERROKERAS_COMPILE_PROGRESS", "0")
    K.gradients(loss, [w])
    K.function([x], [loss, g])
    assert capsys.readouterr().err == ""
