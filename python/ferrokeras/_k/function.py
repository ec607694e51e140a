"""`function` (compiled calls with updates) and `gradients`."""

import contextlib
import sys
import threading
import time

import numpy as np

from .. import _core
from ..config import compile_progress_after
from ..tensor import Tensor, non_numeric, wrap
from .common import _t
from .variables import Variable, _Update, _update_target, update


def _flatten(items):
    for it in items:
        if isinstance(it, (list, tuple)) and not (len(it) == 2 and isinstance(it[0], Variable)):
            yield from _flatten(it)
        else:
            yield it


class Function:
    """A compiled computation: feeds ``inputs``, returns ``outputs`` as NumPy arrays, and
    applies ``updates`` after computing everything from the pre-call values."""

    def __init__(self, inputs, outputs, updates=None, name=None, verbose=None):
        self.inputs = list(inputs)
        self._single = not isinstance(outputs, (list, tuple))
        self.outputs = [outputs] if self._single else list(outputs)
        for t in self.inputs:
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"function: inputs must be tensors (placeholders), got {type(t).__name__}"
                )
        outs = [_t(o) for o in self.outputs]
        pairs = []
        for u in _flatten(updates or []):
            if isinstance(u, _Update):
                pairs.append((u._target._core, u._core))
            elif isinstance(u, (list, tuple)) and len(u) == 2:
                target = _update_target(u[0], "function")
                val = update(target, u[1])
                pairs.append((target._core, val._core))
            else:
                raise TypeError(
                    f"function: an update must be an (variable, new_value) pair or K.update(...), got {u!r}"
                )
        self.name = name
        self._dtypes = [np.dtype(t.dtype) for t in self.inputs]
        self._progress_after = _progress_after(verbose)
        # The plan is built without the GIL, so the report runs while it is built.
        with _watched(self._progress_after, f"ferrokeras: planning {self._label()}"):
            self._f = _core.Function(
                [t._core for t in self.inputs], [o._core for o in outs], pairs, name
            )

    def __call__(self, inputs=()):
        if isinstance(inputs, dict):
            inputs = [inputs[t] for t in self.inputs]
        if not isinstance(inputs, (list, tuple)):
            raise TypeError(
                f"function: call with a list of input values, got {type(inputs).__name__}"
            )
        if len(inputs) != len(self.inputs):
            raise ValueError(f"function expects {len(self.inputs)} input values, got {len(inputs)}")
        arrs = []
        for t, v, dt in zip(self.inputs, inputs, self._dtypes):
            if hasattr(v, "toarray"):
                v = v.toarray()
            arr = np.asarray(v)
            if arr.dtype != dt:
                bad = non_numeric(arr)
                if bad:
                    raise TypeError(
                        f"cannot feed values of type {bad} to '{t.name}', which has dtype {dt.name}"
                    )
                if arr.dtype.kind == "c":
                    raise TypeError(
                        f"cannot feed complex values to '{t.name}', which has dtype {dt.name}"
                    )
                if arr.dtype.kind == "f" and dt.kind in "iub" and arr.size and not _integral(arr):
                    raise TypeError(
                        f"cannot feed non-integer values to '{t.name}', which has dtype {dt.name}"
                    )
                if dt.kind in "iu" and arr.dtype.kind in "iuf" and arr.size:
                    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
                    if arr.min() < lo or arr.max() > hi:
                        raise ValueError(
                            f"cannot feed values in [{arr.min()}, {arr.max()}] to '{t.name}': "
                            f"outside the range of its dtype {dt.name} [{lo}, {hi}]"
                        )
                arr = arr.astype(dt)
            arrs.append(arr)
        if self._progress_after is not None:
            out = self._first_call(arrs)
        else:
            out = self._f(arrs)
        # 0-d results come back as NumPy scalars (np.float32, ...), as TensorFlow's
        # session.run and EagerTensor.numpy() give them.
        out = [o[()] if o.ndim == 0 else o for o in out]
        return out[0] if self._single else out

    def _label(self):
        return f"K.function '{self.name}'" if self.name else "a K.function"

    def _first_call(self, arrs):
        """The first call compiles the plan's kernels (the CPU's fused programs, the GPU's
        pipelines) while it runs; when it takes more than ``_progress_after`` seconds its
        elapsed time is reported on stderr while it goes on, then its total."""
        what = f"ferrokeras: compiling and running the first call of {self._label()}"
        with _watched(self._progress_after, what):
            out = self._f(arrs)
        # Only a call that succeeded compiled everything; a failed one reports again.
        self._progress_after = None
        return out

    @property
    def dispatches(self):
        """Kernel launches of the last call (folded constants excluded; on a GPU a fused
        elementwise chain counts once). Before the first call: the CPU plan's count."""
        return self._f.dispatches

    @property
    def submits(self):
        """GPU queue submissions of the last call (1 when the plan runs wholly on a GPU)."""
        return self._f.submits


def _progress_after(verbose):
    """Seconds after which a compile is reported on stderr, or None for never: ``verbose``
    0/False silences it, 1/True or None (the default) report after the
    ``FERROKERAS_COMPILE_PROGRESS`` setting: ``0`` (never), or a number of seconds
    (default 2)."""
    if verbose is not None and not isinstance(verbose, (bool, int, np.integer)):
        raise TypeError(f"K.function: verbose must be 0, 1 or None, got {verbose!r}")
    if verbose is not None and not verbose:
        return None
    return compile_progress_after()


def _write_progress(text):
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass  # no usable stderr (closed, or None under pythonw)


@contextlib.contextmanager
def _watched(after, what):
    """Runs the block with ``what`` reported on stderr once it has taken ``after`` seconds
    (``None``: never), from a thread (`_report_progress`)."""
    if after is None:
        yield
        return
    done = threading.Event()
    reporter = threading.Thread(
        target=_report_progress, args=(done, time.perf_counter(), after, what), daemon=True
    )
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()


def _phase():
    """What the engine is compiling now, as `` (phase)``, or ``''``."""
    phase = _core.compile_phase()
    return f" ({phase})" if phase else ""


def _report_progress(done, start, after, what):
    """Waits for ``done``; past ``after`` seconds reports the elapsed time and the compile
    phase the engine is in: on a terminal one line rewritten every second, elsewhere a line
    at 1x, 2x, 4x, ... ``after``, and the total when the work is done."""
    if done.wait(after):
        return
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    next_line = after
    width = 0
    while True:
        elapsed = time.perf_counter() - start
        if tty:
            frame = f"{what}: {elapsed:.0f} s{_phase()}"
            _write_progress("\r" + frame.ljust(width))
            width = max(width, len(frame))
        elif elapsed >= next_line:
            _write_progress(f"{what}: {elapsed:.1f} s so far{_phase()}\n")
            while next_line <= elapsed:  # a late wake-up skips the lines it missed
                next_line *= 2
        if done.wait(1.0 if tty else max(0.05, next_line - elapsed)):
            break
    total = time.perf_counter() - start
    frame = f"{what}: done in {total:.1f} s"
    _write_progress(f"\r{frame.ljust(width)}\n" if tty else f"{frame}\n")


def _integral(arr):
    """Whether every value of a float array is a whole number (inf and NaN are not)."""
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.mod(arr, 1) == 0))


def function(inputs, outputs, updates=None, name=None, verbose=None, **kwargs):
    """Instantiates a Keras function.

    Arguments:
        inputs: List of placeholder tensors.
        outputs: List of output tensors.
        updates: List of update ops (``K.update(...)``) or ``(variable, new_value)`` pairs.
        name: String, name of the function.
        verbose: Compile progress on stderr. The plan is built here and the first call
            compiles its kernels while it runs; when either takes longer than 2 seconds
            (``FERROKERAS_COMPILE_PROGRESS=<seconds>`` changes that, ``=0`` turns it
            off) the elapsed time and the compile phase the engine is in are reported
            until it is done. ``0`` silences it for this function; ``None`` (default) and
            ``1`` follow the environment. Under Keras, ``model.compile(..., verbose=0)``
            passes it on.
        **kwargs: Not supported; any other keyword raises ``ValueError``.

    Returns:
        A callable: given a list of NumPy arrays, one per input, it returns the list of
        output values as NumPy arrays. Outputs and update values are all computed from the
        values before the call; the updates are then assigned together.

    Raises:
        ValueError: if invalid kwargs are passed in.
        TypeError: if ``inputs`` is not a list or tuple.

    Example:
        >>> from ferrokeras import backend as K
        >>> import numpy as np
        >>> x = K.placeholder(shape=(None, 2))
        >>> f = K.function([x], [x * 2])
        >>> f([np.ones((1, 2))])[0]
        array([[2., 2.]], dtype=float32)
    """
    if kwargs:
        raise ValueError(
            f"Invalid argument(s) {sorted(kwargs)} passed to K.function: "
            "it takes inputs, outputs, updates, name and verbose"
        )
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(
            f"K.function: `inputs` must be a list or tuple of placeholders, got {type(inputs).__name__}"
        )
    return Function(inputs, outputs, updates=updates, name=name, verbose=verbose)


def gradients(loss, variables):
    """Returns the gradients of ``loss`` with respect to ``variables``.

    Arguments:
        loss: Scalar tensor to minimize (a non-scalar loss is summed).
        variables: List of variables (or tensors).

    Returns:
        A list of gradient tensors, ``None`` where ``loss`` does not depend on a variable.
        The gradients are graph tensors, so they can be differentiated again.

    Example:
        >>> from ferrokeras import backend as K
        >>> x = K.variable(3.0)
        >>> K.eval(K.gradients(x * x, [x])[0])
        array(6., dtype=float32)
    """
    single = not isinstance(variables, (list, tuple))
    vs = [variables] if single else list(variables)
    loss = _t(loss)
    # Differentiating a large model can take seconds: reported as a compile is.
    with _watched(compile_progress_after(), "ferrokeras: K.gradients"):
        gs = _core.gradients(loss._core, [_t(v)._core for v in vs])
    out = [None if g is None else wrap(g) for g in gs]
    return out[0] if single else out


def stop_gradient(variables):
    """Returns ``variables`` with gradients stopped: a tensor or a list of tensors whose
    gradient with respect to everything is zero."""
    if isinstance(variables, (list, tuple)):
        return [stop_gradient(v) for v in variables]
    return wrap(_core.stop_gradient(_t(variables)._core))


__all__ = [
    n
    for n, v in list(globals().items())
    if not n.startswith("_") and getattr(v, "__module__", None) == __name__
]
