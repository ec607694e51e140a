"""Summarise a py-spy profile (`--format raw`, folded stacks) of a ferrokeras training run.

    py-spy record --native --idle --format raw -r 200 -o /tmp/mlp.pyspy -- \\
        .venv/bin/python benches/profile_step.py train --workload mlp --seconds 25
    .venv/bin/python benches/profile_summary.py /tmp/mlp.pyspy

py-spy samples the Python thread only (rayon's worker threads have no Python frames), so
this answers "where does the Python thread's wall time go": Keras and other Python code,
ferrokeras' Python wrapper, a kernel running on the calling thread, or blocked while the
rayon workers run a parallel kernel. Use `perf` (see docs/performance.md) for the workers.
Only stacks containing --focus (default: the steady-state training loop) are counted.
"""

import argparse
import re
from collections import Counter


def parse(path):
    stacks = Counter()
    with open(path) as f:
        for ln in f:
            stack, _, n = ln.rstrip("\n").rpartition(" ")
            if stack and n.isdigit():
                stacks[stack] += int(n)
    return stacks


def clean(frame):
    frame = re.sub(r"::h[0-9a-f]{16}", "", frame)
    frame = re.sub(r" \((?:ferrokeras/)?_core\.abi3\.so\)|\(libc\.so\.6\)", "", frame)
    return frame.strip()


def classify(frames):
    try:
        i = next(k for k, f in enumerate(frames) if "ferrokeras/_k/function.py" in f)
    except StopIteration:
        py = [f for f in frames if ".py:" in f]
        return "Keras / Python outside the K.function call", clean(py[-1]) if py else "?"
    inner = frames[i + 1 :]
    if not inner:
        return "ferrokeras Python wrapper (function.py)", clean(frames[i])
    joined = ";".join(inner)
    if "LockLatch" in joined or "in_worker_cold" in joined:
        what = "Mutex::lock_contended" if "lock_contended" in joined else "futex wait"
        return "engine: blocked while rayon workers run a kernel", what
    core = [f for f in inner if "_core::" in f or "ferrokeras::" in f]
    leaf = clean(inner[-1])
    if core:
        return "engine: kernel on the calling thread", clean(core[0])
    if re.search(r"numpy|PyArray|_multiarray", joined):
        return "engine: NumPy conversion", leaf
    return "engine: other native", leaf


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folded")
    p.add_argument(
        "--focus",
        default="steady_state_fit (",
        help="count only stacks containing this frame text (default: the timed loop)",
    )
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args()
    stacks = parse(a.folded)
    kept = {s: n for s, n in stacks.items() if a.focus in s}
    total = sum(kept.values())
    print(
        f"{a.folded}: {sum(stacks.values())} samples of the Python thread, {total} in the "
        f"focus ({a.focus!r})"
    )
    parts, detail = Counter(), {}
    for s, n in kept.items():
        part, what = classify(s.split(";"))
        parts[part] += n
        detail.setdefault(part, Counter())[what] += n
    for part, n in parts.most_common():
        print(f"  {n / max(total, 1):6.1%}  {part}")
        for what, m in detail[part].most_common(a.top):
            print(f"            {m / max(total, 1):6.1%}  {what[:110]}")


if __name__ == "__main__":
    main()
