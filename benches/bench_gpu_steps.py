"""Keras 2.3.1 training steps timed on every ferrokeras device, and in PyTorch CUDA.

    python benches/bench_gpu_steps.py                 # mlp, cnn, lstm, gru, cifar_bn, embedding
    python benches/bench_gpu_steps.py --models mlp,lstm --rounds 5

Builds each step of `gpu_counts.py` once, then for each device ferrokeras sees (the CPU
and each GPU adapter) sets the same starting weights and times `train_on_batch` on the
same batch: the median of `--rounds` rounds of `--calls` calls after two warm-up calls,
in milliseconds per step, with the step's dispatches, submits and host nodes. Where
PyTorch with CUDA is importable, the MLP, CNN and LSTM are also timed as the same models
written in PyTorch (fp32, TF32 off, `torch.cuda.synchronize()` after each step). Software
adapters (Mesa llvmpipe) are labelled: their times say nothing about GPU speed.
"""

import argparse
import os
import statistics
import sys
import time

os.environ["KERAS_BACKEND"] = "ferrokeras.backend"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_counts  # noqa: E402
import numpy as np  # noqa: E402

DEFAULT = "mlp,cnn,lstm,gru,cifar_bn,embedding"


def time_step(step, rounds, calls):
    """Median milliseconds per call of `step` over `rounds` rounds of `calls` calls."""
    for _ in range(2):
        step()
    per = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        per.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(per)


def torch_step(name, batch):
    """A PyTorch CUDA training step of the same model as `peer_worker`'s `name`, or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    nn = torch.nn
    dev = torch.device("cuda")
    if name == "mlp":
        model = nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.2), nn.Linear(512, 10),
        )  # fmt: skip
        opt = torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.9, eps=1e-7)
        x = torch.randn(batch, 784)
    elif name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
            nn.Linear(64 * 12 * 12, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10),
        )  # fmt: skip
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
        x = torch.randn(batch, 1, 28, 28)
    elif name == "lstm":

        class Lstm(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(32, 64, batch_first=True)
                self.out = nn.Linear(64, 10)

            def forward(self, x):
                return self.out(self.lstm(x)[0][:, -1])

        model = Lstm()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
        x = torch.randn(batch, 50, 32)
    else:
        return None
    model = model.to(dev)
    x = x.to(dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT, help=f"comma-separated (default: {DEFAULT})")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (median)")
    ap.add_argument("--calls", type=int, default=5, help="calls per round")
    args = ap.parse_args()
    import ferrokeras
    import keras
    from keras import backend as K

    cases = {c[0]: c for c in gpu_counts.CASES}
    names = args.models.split(",")
    unknown = [n for n in names if n not in cases]
    if unknown:
        ap.error(f"unknown models: {', '.join(unknown)} (known: {', '.join(cases)})")
    devices = ferrokeras.devices()
    start_device = ferrokeras.device()
    print(
        f"{'model':<10} {'device':<40} {'ms/step':>9} {'dispatches':>10} {'submits':>7} {'host':>5}"
    )
    try:
        for name in names:
            _, build, what = cases[name]
            np.random.seed(0)
            model, x, y, batch = build(keras)
            model._make_train_function()
            start = K.batch_get_value(model.weights + model.optimizer.weights)
            xb, yb = x[:batch], y[:batch]
            for d in devices:
                ferrokeras.set_device(d["device"])
                K.batch_set_value(list(zip(model.weights + model.optimizer.weights, start)))
                ms = time_step(
                    lambda m=model, a=xb, b=yb: m.train_on_batch(a, b), args.rounds, args.calls
                )
                f = model.train_function._f
                label = f"{d['device']} {d['name']}"[:32]
                if d["software"]:
                    label += " (software)"
                print(
                    f"{name:<10} {label:<40} {ms:9.2f} {f.dispatches:>10} {f.submits:>7} "
                    f"{f.host_nodes if d['device'] != 'cpu' else '-':>5}",
                    flush=True,
                )
            step = torch_step(name, batch)
            if step is not None:
                ms = time_step(step, args.rounds, args.calls)
                print(f"{name:<10} {'torch cuda':<40} {ms:9.2f}", flush=True)
    finally:
        ferrokeras.set_device(start_device)


if __name__ == "__main__":
    main()
