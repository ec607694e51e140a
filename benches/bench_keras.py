"""Keras workloads side by side: ferrokeras (through Keras 2.3.1) against TF, JAX and PyTorch.

Every (framework, workload) pair runs in a fresh subprocess, `benches/peer_worker.py`,
with the Python of the virtual environment that holds the framework:

    ferrokeras  .venv (the project venv, Keras 2.3.1)   KERAS_BACKEND=ferrokeras.backend
    tf          benches/.venvs/tf     tensorflow-cpu + tf-keras (TF's Keras 2 API)
    jax         benches/.venvs/jax    keras 3 + jax[cpu]
    torch       benches/.venvs/torch  keras 3 + torch (runs on the CPU)

The pairs run one after another (never two at once), workload by workload, so every
ratio in the table comes from one run on one machine. `make bench` creates the peer
venvs on first use; a peer whose venv is missing gets a column of "n/a (reason)".
See benches/README.md.

    .venv/bin/python benches/bench_keras.py            # full run (3 rounds), ~12-15 min
    .venv/bin/python benches/bench_keras.py --quick    # smoke run, ~2 min
    .venv/bin/python benches/bench_keras.py --frameworks ferrokeras   # the ferrokeras row alone

Raw results go to benches/out/ (git-ignored). When benches/baselines/ holds a baseline for
this machine class (`machine_class`, e.g. amd-epyc-2vcpu.json), the ferrokeras row is also
compared with it.
"""

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT_DIR = HERE / "out"  # git-ignored
BASELINES = HERE / "baselines"  # one committed full run per machine class
WORKER = HERE / "peer_worker.py"
MARK = "@@RESULT@@"

FRAMEWORKS = ("ferrokeras", "tf", "jax", "torch")
LABELS = {
    "ferrokeras": "ferrokeras",
    "tf": "TF (tf-keras)",
    "jax": "Keras3+JAX",
    "torch": "Keras3+PyTorch",
}
# Peers: venv folder and the packages `make bench` installs there (see the Makefile).
PEER_VENVS = {"tf": "tf", "jax": "jax", "torch": "torch"}
# Other ferrokeras builds run as columns of their own (--build NAME=DIR): column name ->
# the `python/` folder of a source tree whose extension is built there. They run in the
# project venv with that folder first on the path, and are not peers: the table gives
# ferrokeras' ratio to each of them in a column of its own.
BUILDS = {}

# workload key, label, unit, higher-is-better
WORKLOADS = [
    ("call4x4", "K.function call, 4x4 graph", "us/call", False),
    ("dot1024", "K.dot 1024^3 via K.function", "GFLOP/s", True),
    ("mlp", "MLP 784-512-512-10 dropout rmsprop b128", "samples/s", True),
    ("cnn", "CNN conv32-conv64-pool-d128 adam b64", "samples/s", True),
    ("lstm", "LSTM(64) 50x32 adam b64", "samples/s", True),
]
KERAS2_ONLY = {"call4x4", "dot1024"}  # Keras 3 has no K.function / K.placeholder

# The targets ferrokeras is held to:
# (description, check(ferrokeras value, {peer: value}) -> bool | None)
TARGETS = {
    "call4x4": ("<= 20 us", lambda f, p: f <= 20.0),
    "dot1024": (">= 1.0x TF", lambda f, p: f >= p["tf"] if "tf" in p else None),
    "mlp": (">= 1.25x best peer", lambda f, p: f >= 1.25 * max(p.values()) if p else None),
    "cnn": (">= 1.25x best peer", lambda f, p: f >= 1.25 * max(p.values()) if p else None),
    "lstm": (">= 1.25x best peer", lambda f, p: f >= 1.25 * max(p.values()) if p else None),
}


def python_for(fw):
    if fw == "ferrokeras" or fw in BUILDS:  # the project venv (Keras 2.3.1 + the built extension)
        venv_py = ROOT / ".venv" / "bin" / "python"
        return venv_py if venv_py.exists() else Path(sys.executable)
    return HERE / ".venvs" / PEER_VENVS[fw] / "bin" / "python"


def peer_missing(fw):
    """None if the framework's venv is usable, else why not."""
    if fw == "ferrokeras":
        return None
    if fw in BUILDS:
        if not list((BUILDS[fw] / "ferrokeras").glob("_core*.so")):
            return f"no built extension in {BUILDS[fw] / 'ferrokeras'}"
        return None
    venv = HERE / ".venvs" / PEER_VENVS[fw]
    if not (venv / "bin" / "python").exists():
        return f"venv {venv.relative_to(ROOT)} missing; run `make bench-venvs`"
    if not (venv / ".stamp").exists():
        log = venv.parent / f"{fw}.log"
        hint = f" (see {log.relative_to(ROOT)})" if log.exists() else ""
        return f"install incomplete{hint}"
    return None


def worker_env(fw):
    env = dict(os.environ)
    env.pop("KERAS_BACKEND", None)
    if fw in BUILDS:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(BUILDS[fw]), env.get("PYTHONPATH")) if p
        )
    elif fw != "ferrokeras":
        env.pop("PYTHONPATH", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["CUDA_VISIBLE_DEVICES"] = ""  # the tf and torch wheels bring CUDA: keep them on the CPU
    # OpenMP (PyTorch's thread pool) spin-waits by default; on a 2-core machine shared with
    # other work that makes PyTorch up to 8x slower whenever another process holds a core.
    # Passive waiting is what a shared machine needs; set OMP_WAIT_POLICY=ACTIVE to override.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # NumPy's OpenBLAS (Keras's Orthogonal initializer runs an SVD before training) leaves
    # its threads busy-waiting afterwards, taking a core from whichever framework then
    # trains. NumPy work is outside every timed loop, so one BLAS thread costs nothing there.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def run_worker(fw, workloads, quick, timeout):
    """Runs `workloads` (a list) for `fw` in one subprocess; returns {workload: result}."""
    name = "ferrokeras" if fw in BUILDS else fw
    cmd = [str(python_for(fw)), str(WORKER), "--framework", name, "--workload", ",".join(workloads)]
    if quick:
        cmd.append("--quick")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout * len(workloads),
            cwd=ROOT,
            env=worker_env(fw),
        )
        stdout, stderr, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr, rc = f"timed out after {timeout * len(workloads)}s", "timeout"
    took = time.perf_counter() - t0
    out = {}
    for ln in stdout.splitlines():
        if ln.startswith(MARK):
            res = json.loads(ln[len(MARK) :])
            res["subprocess_s"] = took
            out[res["workload"]] = res
    for w in workloads:
        if w not in out:
            tail = (stderr or stdout).strip().splitlines()[-3:]
            out[w] = {"status": "error", "reason": f"worker exit {rc}: " + " | ".join(tail)[:300]}
    return out


def machine():
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        fields = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        info["cpu_model"] = fields.get("Model name", "?")
        info["cores"] = fields.get("CPU(s)", "?")
        flags = fields.get("Flags", "").split()
        info["avx2"] = "avx2" in flags
        info["avx512f"] = "avx512f" in flags
        info["hypervisor"] = fields.get("Hypervisor vendor")
    except (OSError, ValueError):
        pass
    try:  # which engine was measured: the commit, uncommitted engine edits, the build time
        git = lambda *a: subprocess.run(
            ["git", *a], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()  # noqa: E731
        info["git_commit"] = git("rev-parse", "--short", "HEAD")
        info["git_dirty_engine_files"] = git(
            "status", "--porcelain", "--", "src", "python", "Cargo.toml"
        ).splitlines()
        so = sorted((ROOT / "python" / "ferrokeras").glob("_core*.so"))
        if so:
            info["extension_built"] = dt.datetime.fromtimestamp(so[0].stat().st_mtime).isoformat(
                timespec="seconds"
            )
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def machine_class(info):
    """The name of a machine's baseline file: CPU model and CPU count, `vcpu` under a
    hypervisor (e.g. `amd-epyc-2vcpu`)."""
    model = str(info.get("cpu_model") or "").lower().split("@")[0]
    model = re.sub(r"\((r|tm)\)|\b(processor|cpu)\b", " ", model)
    model = re.sub(r"[^a-z0-9]+", "-", model).strip("-") or "unknown-cpu"
    kind = "vcpu" if info.get("hypervisor") else "cpu"
    return f"{model}-{info.get('cpus', '?')}{kind}"


def baseline_rows(results, base):
    """Rows comparing the ferrokeras cells of `results` with those of a baseline run."""
    rows = [["workload", "ferrokeras now", "baseline", "now / baseline"]]
    for key, label, unit, higher in WORKLOADS:
        now = results.get(key, {}).get("ferrokeras")
        old = base.get("results", {}).get(key, {}).get("ferrokeras")
        if not now or not old:
            continue
        ratio = "-"
        if now.get("status") == "ok" and old.get("status") == "ok" and now["value"] > 0:
            r = now["value"] / old["value"] if higher else old["value"] / now["value"]
            ratio = f"{r:.2f}x"
        rows.append([label, fmt(now, unit), fmt(old, unit), ratio])
    return rows


def fmt(res, unit):
    if res is None:
        return "-"
    if res.get("status") != "ok":
        return (
            f"n/a ({res.get('reason', '?')})"
            if res.get("status") == "n/a"
            else f"error ({res.get('reason', '?')[:40]})"
        )
    v = res["value"]
    if unit == "us/call":
        return f"{v:.1f} us"
    if unit == "GFLOP/s":
        return f"{v:.1f} GFLOP/s"
    return f"{v:,.0f}"


def table(results, frameworks):
    """Rows of the side-by-side table (list of lists of strings)."""
    builds = [f for f in frameworks if f in BUILDS]
    head = (
        ["workload"]
        + [LABELS[f] for f in frameworks]
        + ["ferrokeras / best peer", "target"]
        + [f"ferrokeras / {LABELS[b]}" for b in builds]
    )
    rows = [head]
    for key, label, unit, higher in WORKLOADS:
        if key not in results:
            continue
        r = results[key]
        row = [label]
        for fw in frameworks:
            row.append(fmt(r.get(fw), unit))
        ours = r.get("ferrokeras")
        peers = {
            fw: v["value"]
            for fw, v in r.items()
            if fw in PEER_VENVS and v and v.get("status") == "ok"
        }
        if ours and ours.get("status") == "ok" and peers:
            f = ours["value"]
            if higher:
                best = max(peers, key=peers.get)
                ratio = f / peers[best]
            else:  # latency: express as a speed ratio so that above 1x is ahead
                best = min(peers, key=peers.get)
                ratio = peers[best] / f
            row.append(f"{ratio:.2f}x (vs {LABELS[best]})")
        else:
            row.append("-")
        desc, check = TARGETS[key]
        met = check(ours["value"], peers) if ours and ours.get("status") == "ok" else None
        row.append(f"{desc}: " + {True: "met", False: "MISSED", None: "?"}[met])
        for b in builds:
            other = r.get(b)
            if ours and other and ours.get("status") == "ok" and other.get("status") == "ok":
                q = ours["value"] / other["value"] if higher else other["value"] / ours["value"]
                row.append(f"{q:.2f}x")
            else:
                row.append("-")
        rows.append(row)
    # Peak memory while training the MLP (target: no higher than TF's).
    m = results.get("mlp", {})
    if m:
        row = ["MLP peak RSS (MiB)"]
        for fw in frameworks:
            v = m.get(fw)
            row.append(f"{v['peak_rss_mib']:.0f} MiB" if v and v.get("status") == "ok" else "-")
        ours, tf = m.get("ferrokeras"), m.get("tf")
        if ours and tf and ours.get("status") == "ok" and tf.get("status") == "ok":
            ratio = ours["peak_rss_mib"] / tf["peak_rss_mib"]
            row.append(f"{ratio:.2f}x of TF (lower is better)")
            row.append("<= TF: " + ("met" if ratio <= 1.0 else "MISSED"))
        else:
            row += ["-", "<= TF: ?"]
        for b in builds:
            other = m.get(b)
            ok = ours and other and ours.get("status") == "ok" and other.get("status") == "ok"
            row.append(f"{ours['peak_rss_mib'] / other['peak_rss_mib']:.2f}x" if ok else "-")
        rows.append(row)
    return rows


def median_round(runs):
    """One framework's result from its rounds of a workload: the round with the median value
    (the lower middle one of an even count), with every round's value in `rounds` and the
    highest peak RSS of any round. A round that did not run ok makes the cell its error."""
    bad = [r for r in runs if r.get("status") != "ok"]
    if bad or len(runs) == 1:
        return bad[0] if bad else runs[0]
    values = sorted(r["value"] for r in runs)
    mid = values[(len(values) - 1) // 2]
    res = dict(next(r for r in runs if r["value"] == mid))
    res["rounds"] = [r["value"] for r in runs]
    if all("peak_rss_mib" in r for r in runs):
        res["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
    res["subprocess_s"] = sum(r.get("subprocess_s", 0.0) for r in runs)
    return res


def render(rows, markdown=False):
    if markdown:
        out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join(
        [line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]]
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="small epochs and few repeats: a ~2 minute smoke run"
    )
    p.add_argument(
        "--frameworks",
        default=",".join(FRAMEWORKS),
        help="comma-separated subset of " + ",".join(FRAMEWORKS),
    )
    p.add_argument(
        "--workloads",
        default=",".join(w[0] for w in WORKLOADS),
        help="comma-separated subset of " + ",".join(w[0] for w in WORKLOADS),
    )
    p.add_argument(
        "--out",
        help="where to write the raw JSON (default benches/out/<date>-<time>[-tag].json; "
        "benches/out/ is git-ignored)",
    )
    p.add_argument(
        "--baseline",
        metavar="JSON",
        help="compare the ferrokeras row with this earlier run; default: "
        "benches/baselines/<machine class>.json when it exists; 'none' to skip",
    )
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument(
        "--peers-from",
        metavar="JSON",
        help="fill the columns of frameworks not run now from an earlier results file "
        "(e.g. rerun ferrokeras alone; its ratios then compare across runs)",
    )
    p.add_argument(
        "--timeout", type=int, default=None, help="seconds per worker (default 120 quick, 420 full)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of the training workloads (each round runs them all, the frameworks "
        "taking turns) (default 3 in a full run, 1 in --quick); a cell is the median round",
    )
    p.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run the ferrokeras build in the source tree DIR (its extension built in "
        "DIR/python, e.g. a git worktree of an earlier commit) as the column NAME, taking "
        "turns with the others; repeatable",
    )
    a = p.parse_args()

    frameworks = [f for f in a.frameworks.split(",") if f]
    for spec in a.build:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder or name in FRAMEWORKS:
            p.error(f"--build takes NAME=DIR with a NAME not among {FRAMEWORKS}: {spec!r}")
        if not (Path(folder) / "python" / "ferrokeras").is_dir():
            p.error(f"--build {spec!r}: {folder}/python/ferrokeras is not a directory")
        BUILDS[name] = (Path(folder) / "python").resolve()
        LABELS[name] = f"ferrokeras@{name}"
        frameworks.append(name)
    workloads = [w for w in a.workloads.split(",") if w]
    for f in frameworks:
        if f not in FRAMEWORKS and f not in BUILDS:
            p.error(f"unknown framework {f!r}")
    for w in workloads:
        if w not in {k for k, *_ in WORKLOADS}:
            p.error(f"unknown workload {w!r}")
    timeout = a.timeout or (120 if a.quick else 420)
    rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    if rounds < 1 or (a.quick and rounds > 1):
        p.error("--rounds must be at least 1, and 1 with --quick")

    started = dt.datetime.now()
    info = machine()
    info["loadavg_start"] = os.getloadavg()
    info["omp_wait_policy"] = worker_env("tf")["OMP_WAIT_POLICY"]
    print(
        f"machine: {info.get('cpu_model')}, {info.get('cores')} CPUs, "
        f"AVX-512: {'yes' if info.get('avx512f') else 'no'}, "
        f"load average {info['loadavg_start'][0]:.2f}"
    )
    missing = {fw: peer_missing(fw) for fw in frameworks}
    for fw, why in missing.items():
        if why:
            print(f"skipping {LABELS[fw]}: {why}")

    results = {k: {} for k, *_ in WORKLOADS if k in workloads}
    versions = {}
    units = {k: (label, unit) for k, label, unit, _ in WORKLOADS}

    def record(fw, key, res):
        results[key][fw] = res
        if res.get("versions"):
            versions[fw] = res["versions"]
        label, unit = units[key]
        took = f" ({res['subprocess_s']:.0f}s)" if "subprocess_s" in res else ""
        print(f"  {label:42s} {LABELS[fw]:15s} {fmt(res, unit)}{took}", flush=True)

    def pending(fw, key):
        if missing[fw]:
            return {"status": "n/a", "reason": "not installed"}
        if key in KERAS2_ONLY and fw in ("jax", "torch"):
            return {"status": "n/a", "reason": "Keras 3: no K.function"}
        return None

    if a.quick:
        # One process per framework (imports dominate a smoke run); workload by workload
        # otherwise, each pair in a fresh process, so peak RSS is the workload's own.
        for fw in frameworks:
            # MLP first, so its peak RSS is not raised by the workloads before it.
            todo = sorted((k for k in results if pending(fw, k) is None), key=lambda k: k != "mlp")
            got = run_worker(fw, todo, True, timeout) if todo else {}
            for key in results:
                record(fw, key, pending(fw, key) or got[key])
    else:
        # A training row's timed epochs span a second or two, so a slow spell of a shared
        # machine (minutes, at times) could fall on one framework alone. Those rows run in
        # rounds: each round runs every training workload once per framework (the
        # frameworks taking turns, in an order rotated round by round), so one workload's
        # rounds lie minutes apart, and each cell is the framework's median round. The call
        # and dot rows run in every round too: their repeats span a fraction of a second,
        # and one slow spell had put ferrokeras' K.dot at 141 GFLOP/s where the same build
        # measured 189-200 minutes later (TF 94-148 across the same runs).
        runs = {key: {fw: [] for fw in frameworks} for key in results}
        for r in range(rounds):
            for key in results:
                for fw in frameworks[r % len(frameworks) :] + frameworks[: r % len(frameworks)]:
                    res = pending(fw, key) or run_worker(fw, [key], False, timeout)[key]
                    runs[key][fw].append(res)
                    if rounds > 1:
                        label, unit = units[key]
                        tag = f"round {r + 1}/{rounds}: "
                        print(f"    {tag}{label:42s} {LABELS[fw]:15s} {fmt(res, unit)}", flush=True)
        if rounds > 1:
            print("medians of the rounds:")
        for key in results:
            for fw in frameworks:
                record(fw, key, median_round(runs[key][fw]))

    shown = list(frameworks)
    if a.peers_from:
        old = json.loads(Path(a.peers_from).read_text())
        for fw in FRAMEWORKS:
            if fw in frameworks:
                continue
            shown.append(fw)
            for key in results:
                prev = old.get("results", {}).get(key, {}).get(fw)
                if prev is not None:
                    results[key][fw] = dict(prev, from_file=a.peers_from)
        shown = [fw for fw in FRAMEWORKS if fw in shown] + [b for b in frameworks if b in BUILDS]
        print(
            f"columns of {', '.join(LABELS[f] for f in shown if f not in frameworks)} "
            f"are from {a.peers_from} (started {old.get('started')})"
        )

    info["loadavg_end"] = os.getloadavg()
    rows = table(results, shown)
    print()
    print(render(rows))
    print(
        "\nTraining rows: samples/second, median of timed epochs after the warm-up epochs"
        + (
            f", median of {rounds} rounds in which the frameworks take turns. "
            if rounds > 1
            else ". "
        )
        + "Ratio: ferrokeras speed / best peer's speed\n(above 1x: ferrokeras is ahead; "
        "for us/call the ratio is best peer time / ferrokeras time). Load average "
        f"{info['loadavg_start'][0]:.2f} -> {info['loadavg_end'][0]:.2f}."
    )
    if a.markdown:
        print()
        print(render(rows, markdown=True))

    tag = []
    if a.quick:
        tag.append("quick")
    if set(frameworks) != set(FRAMEWORKS):
        tag.append("+".join(frameworks))
    if set(workloads) != {k for k, *_ in WORKLOADS}:
        tag.append("+".join(workloads))
    if a.baseline and a.baseline != "none":
        base_path = Path(a.baseline)
    elif a.baseline is None:
        base_path = BASELINES / f"{machine_class(info)}.json"
        base_path = base_path if base_path.exists() else None
    else:
        base_path = None
    if base_path is not None:
        base = json.loads(base_path.read_text())
        rows_b = baseline_rows(results, base)
        if len(rows_b) > 1:
            inside = base_path.resolve().is_relative_to(ROOT)
            shown_path = base_path.resolve().relative_to(ROOT) if inside else base_path
            print(
                f"\nferrokeras against the baseline {shown_path} (started {base.get('started')}, "
                f"commit {base.get('machine', {}).get('git_commit')}); above 1x: faster now"
            )
            print(render(rows_b))
    elif a.baseline == "none":
        print("\nno comparison with a baseline (--baseline none)")
    else:
        print(
            f"\nno baseline for this machine class ({machine_class(info)}); "
            f"see benches/README.md to make one"
        )

    out = (
        Path(a.out)
        if a.out
        else OUT_DIR
        / (started.strftime("%Y-%m-%d-%H%M") + ("-" + "-".join(tag) if tag else "") + ".json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now().isoformat(timespec="seconds"),
        "quick": a.quick,
        "rounds": rounds,
        "machine": info,
        "versions": versions,
        "frameworks": frameworks,
        "peers_from": a.peers_from,
        "machine_class": machine_class(info),
        "results": results,
        "table": rows,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"raw results: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
