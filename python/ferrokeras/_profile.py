"""``ferrokeras.profile``: a kernel-level trace of the compiled calls run inside a ``with``
block, written as Chrome trace-event JSON (Perfetto, chrome://tracing, TensorBoard's
profile plugin), and ``profile_summary``, the top ops of a trace as a table."""

import gzip
import json
import os
import socket
import sys
import time

from . import _core

# Span categories that contain other spans: left out of the summary, whose rows add up
# the time of the work itself.
_CONTAINERS = frozenset({"call", "loop", "loop.run", "loop.step"})

_last_path = [None]


def _check_path(path, what):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"profile: {what} must be a path (str or os.PathLike), got {path!r}")
    return os.fspath(path)


class profile:
    """Records every compiled call run inside the block into a Chrome trace file.

    Each ``K.function`` call is a span (named after the function when it has a name);
    inside it, a span per schedule item the call ran: the op (its input shapes, result
    shape, dtype and device in ``args``), a fused elementwise group (its member ops in
    ``args.members``), a loop (a span per step on the thread that ran the body), a
    ``py_function`` callback; on a GPU, the recording of each node's kernels and each
    queue submit (with the wait for its results). Spans carry the thread that ran them
    (the calling thread, or a rayon worker). Open the file in https://ui.perfetto.dev or
    chrome://tracing; ``profile_summary()`` prints its top ops.

    Blocks may nest (and repeat): each writes the calls that ran inside it. Outside any
    block the engine records nothing and pays one atomic load per call and item.

    Arguments:
        path: Where to write the trace JSON (``None``: only ``tensorboard_dir``). The file
            is created when the block starts, so a bad path raises there.
        tensorboard_dir: Also write the trace, gzipped, where TensorBoard's profile plugin
            looks for it: ``<tensorboard_dir>/plugins/profile/<run>/<host>.trace.json.gz``.
        run: The run's directory name under ``plugins/profile`` (default: the time the
            block started, ``YYYY_MM_DD_HH_MM_SS`` as TensorFlow names them).

    Raises:
        TypeError: ``path`` or ``tensorboard_dir`` is not a path, or both are ``None``.
        FileNotFoundError, IsADirectoryError, PermissionError: the trace file cannot be
            created (raised when the block starts).

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> import ferrokeras
        >>> from ferrokeras import backend as K
        >>> x = K.placeholder(shape=(2, 2))
        >>> f = K.function([x], [K.tanh(x) * 2 + 1], name='demo')
        >>> path = os.path.join(tempfile.mkdtemp(), 'trace.json')
        >>> with ferrokeras.profile(path):
        ...     _ = f([np.ones((2, 2), 'float32')])
        >>> import json
        >>> spans = json.load(open(path))['traceEvents']
        >>> [s['name'] for s in spans if s.get('cat') == 'call']
        ['K.function demo']
    """

    def __init__(self, path, tensorboard_dir=None, run=None):
        if path is None and tensorboard_dir is None:
            raise TypeError("profile: give a path, a tensorboard_dir or both")
        self.path = None if path is None else _check_path(path, "path")
        self.tensorboard_dir = (
            None if tensorboard_dir is None else _check_path(tensorboard_dir, "tensorboard_dir")
        )
        if run is not None and (not isinstance(run, str) or not run or os.sep in run):
            raise ValueError(f"profile: run must be a directory name, got {run!r}")
        self.run = run
        self._since = None
        self._file = None

    def __enter__(self):
        if self._since is not None:
            raise RuntimeError("profile: this block is already open")
        if self.path is not None:
            try:
                self._file = open(self.path, "w", encoding="utf-8")
            except OSError as e:
                raise type(e)(
                    e.errno, f"profile: cannot create the trace file: {e.strerror}", self.path
                ) from None
        if self.tensorboard_dir is not None and self.run is None:
            self.run = time.strftime("%Y_%m_%d_%H_%M_%S")
        self._since = _core.profile_start()
        return self

    def __exit__(self, *exc):
        since, self._since = self._since, None
        text = _core.profile_stop(since)
        if self._file is not None:
            with self._file:
                self._file.write(text)
            self._file = None
            _last_path[0] = self.path
        if self.tensorboard_dir is not None:
            out = os.path.join(self.tensorboard_dir, "plugins", "profile", self.run)
            os.makedirs(out, exist_ok=True)
            gz = os.path.join(out, f"{socket.gethostname() or 'localhost'}.trace.json.gz")
            with gzip.open(gz, "wt", encoding="utf-8") as f:
                f.write(text)
            if self.path is None:
                _last_path[0] = gz
        return False


def _load(path):
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _row_name(span):
    members = span.get("args", {}).get("members")
    if not members:
        return span["name"]
    text = "+".join(members)
    return f"{span['name']} ({text if len(text) <= 48 else text[:45] + '...'})"


def _self_times(spans):
    """Each span with its own time: its duration less that of the spans directly inside
    it on the same thread (a GPU plan's CPU node holds the submit that downloads its
    inputs; a callback may hold a whole call)."""
    out = []
    by_thread = {}
    for s in spans:
        by_thread.setdefault(s.get("tid"), []).append(s)
    for mine in by_thread.values():
        mine.sort(key=lambda s: (float(s["ts"]), -float(s.get("dur", 0.0))))
        own = [float(s.get("dur", 0.0)) for s in mine]
        stack = []  # indices of the open spans, innermost last
        for k, s in enumerate(mine):
            start = float(s["ts"])
            while stack:
                p = mine[stack[-1]]
                if start < float(p["ts"]) + float(p.get("dur", 0.0)):
                    break
                stack.pop()
            if stack:
                own[stack[-1]] -= float(s.get("dur", 0.0))
            stack.append(k)
        out.extend(zip(mine, (max(t, 0.0) for t in own)))
    return out


class ProfileSummary(list):
    """The rows of ``profile_summary`` (``(op, calls, total_ms, mean_us, percent)``
    tuples, largest total first); ``str()`` gives the printed table."""

    def __init__(self, rows, total_ms, table):
        super().__init__(rows)
        self.total_ms = total_ms
        self.table = table

    def __str__(self):
        return self.table


def profile_summary(path=None, top=20, file=None):
    """Prints the ops of a trace by total time, as a table: op, calls, total ms, mean us,
    % of the time of all ops.

    Each span counts its own time (less the spans inside it on its thread); fused groups
    count per member list; containers (calls, loops, loop steps) are left out, so a
    loop's ops count where its body ran them and the percentages are of the time spent
    in ops.

    Arguments:
        path: A trace written by ``profile`` (``.json`` or ``.json.gz``); default: the last
            one written in this process.
        top: How many rows to print and return (``None``: all).
        file: Where to print (default ``sys.stdout``); ``False`` prints nothing.

    Returns:
        A ``ProfileSummary``: a list of ``(op, calls, total_ms, mean_us, percent)`` rows;
        ``str()`` of it is the table.

    Raises:
        ValueError: no path given and no trace written yet, or the file is not a trace.
        FileNotFoundError: ``path`` does not exist.
    """
    if path is None:
        path = _last_path[0]
        if path is None:
            raise ValueError("profile_summary: no trace written yet; pass the path of one")
    path = _check_path(path, "path")
    try:
        doc = _load(path)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        spans = [e for e in events if e.get("ph") == "X"]
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"profile_summary: {path} is not a Chrome trace: {e}") from None
    stats = {}
    for s, own in _self_times(spans):
        if s.get("cat") in _CONTAINERS:
            continue
        key = _row_name(s)
        calls, total = stats.get(key, (0, 0.0))
        stats[key] = (calls + 1, total + own)
    total_us = sum(t for _, t in stats.values())
    ordered = sorted(stats.items(), key=lambda kv: -kv[1][1])
    rows = [
        (
            name,
            calls,
            total / 1e3,
            total / calls,
            100.0 * total / total_us if total_us else 0.0,
        )
        for name, (calls, total) in ordered
    ]
    shown = rows if top is None else rows[:top]
    width = max([len("op")] + [len(r[0]) for r in shown])
    lines = [
        f"{'op':<{width}}  {'calls':>7}  {'total ms':>10}  {'mean us':>10}  {'%':>6}",
        "-" * (width + 41),
    ]
    for name, calls, total_ms, mean_us, pct in shown:
        lines.append(
            f"{name:<{width}}  {calls:>7}  {total_ms:>10.3f}  {mean_us:>10.1f}  {pct:>6.1f}"
        )
    lines.append(
        f"{len(rows)} ops, {sum(r[1] for r in rows)} spans, {total_us / 1e3:.3f} ms in all"
        + (f" (top {len(shown)} shown)" if len(shown) < len(rows) else "")
    )
    summary = ProfileSummary(shown, total_us / 1e3, "\n".join(lines))
    if file is not False:
        print(summary.table, file=file or sys.stdout)
    return summary
