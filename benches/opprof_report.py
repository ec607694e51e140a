"""Report of a per-op timing table written by an engine built with benches/opprof.patch.

The patch (profiling only, never merged; it touches src/runtime/cpu/mod.rs alone) makes the
CPU executor time every plan item, a node or a fused group, with its shapes (wall time, so a
kernel's rayon workers are included), and write `ns<TAB>count<TAB>key` lines to $FK_OPPROF
every 200 plan runs (loop-body runs included). Older tables (`ns<TAB>count<TAB>bytes<TAB>key`,
with run totals and `[body]` marks) are read too. Build and use it in a private copy, so the
tree's extension is left alone:

    git archive HEAD | tar -x -C /tmp/fk && cd /tmp/fk && patch -p1 < <repo>/benches/opprof.patch
    PYO3_PYTHON=<repo>/.venv/bin/python cargo build --release --lib
    cp target/release/lib_core.so python/ferrokeras/_core.abi3.so
    cd <repo> && FK_OPPROF=/tmp/mlp.opprof PYTHONPATH=/tmp/fk/python \\
        .venv/bin/python benches/profile_step.py train --workload mlp --seconds 20
    .venv/bin/python benches/opprof_report.py /tmp/mlp.opprof

Prints time per training step by primitive, by primitive and shape, and the split between
the kernels, the plan interpreter and the Python boundary.
"""

import argparse
import re
from collections import Counter, defaultdict


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("table")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    rows = []
    runs = 1
    with open(a.table) as f:
        for ln in f:
            if ln.startswith(("top_runs", "runs ")):
                runs = int(ln.split()[1])
                continue
            cols = ln.rstrip("\n").split("\t")
            if len(cols) == 3:  # the current patch: ns, count, key (no bytes column)
                cols.insert(2, "0")
            ns, n, by, key = cols[0], cols[1], cols[2], "\t".join(cols[3:])
            rows.append((int(ns), int(n), int(by), key))
    meta = {k: (ns, n) for ns, n, by, k in rows if k.startswith("==")}
    ops = [(ns, n, by, k) for ns, n, by, k in rows if not k.startswith("==")]
    # Train-function calls: top-level runs also include a few evaluations (variable
    # initialisers), so take the most common launch count of the top-level (primitive,
    # shapes) keys instead: most of them run exactly once per training step.
    counts = Counter(n for ns, n, by, k in ops if not k.startswith("[body]") and n > 1)
    calls = counts.most_common(1)[0][0] if counts else (runs or 1)
    per = lambda ns: ns / calls / 1e6  # ms per call  # noqa: E731
    top_total = meta.get("== run (top level plan, total)", (0, 1))[0]
    top_ops = sum(ns for ns, n, by, k in ops if not k.startswith("[body]"))
    body_total = meta.get("== run (loop body plan, total)", (0, 1))[0]
    body_ops = sum(ns for ns, n, by, k in ops if k.startswith("[body]"))
    loop_ns = sum(ns for ns, n, by, k in ops if k.startswith("loop "))
    if not meta:  # the current patch times plan items only (no run totals, no [body] marks)
        print(
            f"{a.table}: {calls} training calls ({runs} plan runs, loop bodies included); "
            f"kernels {per(sum(ns for ns, n, by, k in ops if not k.startswith('loop '))):.2f} ms per call"
        )
    else:
        print(
            f"{a.table}: {calls} training calls ({runs} top-level plan runs), plan run "
            f"{per(top_total):.2f} ms per call"
        )
        print(
            f"  top-level plan: kernels {per(top_ops):.2f} ms, interpreter between kernels "
            f"{per(top_total - top_ops):.3f} ms ({(top_total - top_ops) / max(top_total, 1):.1%})"
        )
    if body_total > 1:
        print(
            f"  loops: {per(loop_ns):.2f} ms, of which body plans {per(body_total):.2f} ms "
            f"(kernels {per(body_ops):.2f} ms, interpreter {per(body_total - body_ops):.2f} ms); "
            f"loop machinery (slice per step, stack outputs) {per(loop_ns - body_total):.2f} ms"
        )
    n_top = sum(n for ns, n, by, k in ops if not k.startswith("[body]")) / calls
    n_body = sum(n for ns, n, by, k in ops if k.startswith("[body]")) / calls
    print(
        f"  kernel launches per call: {n_top:.0f} top-level + {n_body:.0f} in loop bodies; "
        f"bytes allocated for results per call: "
        f"{sum(by for ns, n, by, k in ops if not k.startswith('loop ')) / calls / 2**20:.1f} MiB"
    )

    def name_of(k):
        body = k.startswith("[body] ")
        k = k[7:] if body else k
        op = re.split(r" \[", k, 1)[0]
        op = re.sub(r" '.*'", "", op)
        return ("[body] " if body else "") + op

    excl = lambda k: k.startswith("loop ")  # noqa: E731  (its time is its body's + machinery)
    by_name = defaultdict(lambda: [0, 0])
    for ns, n, by, k in ops:
        if excl(k):
            continue
        by_name[name_of(k)][0] += ns
        by_name[name_of(k)][1] += n
    kernels = sum(v[0] for v in by_name.values())
    print(
        f"\nkernel time per call by primitive (loops broken down into their bodies), "
        f"of {per(kernels):.2f} ms:"
    )
    for k, (ns, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(
            f"  {per(ns):7.3f} ms  {ns / kernels:6.1%}  {n / calls:6.0f} launches  "
            f"{ns / max(n, 1) / 1e3:8.1f} us each  {k}"
        )
    print("\ntop single (primitive, result shape <- input shapes):")
    for ns, n, by, k in sorted((r for r in ops if not excl(r[3])), key=lambda r: -r[0])[: a.top]:
        print(
            f"  {per(ns):7.3f} ms  {ns / kernels:6.1%}  x{n / calls:<4.0f} {ns / max(n, 1) / 1e3:8.1f} us  {k[:110]}"
        )


if __name__ == "__main__":
    main()
