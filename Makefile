# ferrokeras developer entry points (GNU make).
#
#   make demo         set up .venv, build the extension, run examples/quickstart.py and the
#                     Keras 2.3.1 CNN on scikit-learn's digits (examples/digits_cnn.py)
#   make test         set up, build, run the Rust tests and the pytest suite (docstring
#                     examples included) once per device, then tests/keras under Keras
#                     2.2.4 and 2.2.5 (.venv-keras224, .venv-keras225)
#   make lint         the checks CI gates on: rustfmt, clippy (warnings are errors), ruff
#                     (lint and format), and _core.pyi against the built module (stubtest)
#   make wheel        build one abi3 wheel into dist/
#   make wheel-check  install that wheel in a throw-away venv and run the quickstart there
#                     with no cargo/rustc on PATH
#   make bench        run benches/bench_core.py, then benches/bench_keras.py (ferrokeras vs
#                     TF, Keras 3 + JAX, Keras 3 + PyTorch; peer venvs created on first use;
#                     raw results in benches/out/, compared with benches/baselines/)
#   make bench-quick  the same, as a ~2 minute smoke run
#   make bench-profile  where ferrokeras' time goes in the MLP and LSTM steps (py-spy)
#   make bench-apps   keras.applications ResNet50 and MobileNetV2 (128x128, batch 8) vs TF:
#                     train step, predict at batch 1 and 32, first step, peak RSS
#                     (benches/bench_apps.py; `make bench BENCH_APPS=1` runs it after
#                     bench_keras.py), then the per-op profile of a ResNet50 training step
#                     next to TF's (benches/profile_apps.py)
#   make bench-conv   3x3 conv forward/backward vs TensorFlow and PyTorch CPU (the peer
#                     venvs of make bench, benches/.venvs/tf and torch, made on first use)
#   make bench-gpu    run benches/bench_gpu.py (GPU vs CPU vs NumPy, optional PyTorch CUDA)
#                     and benches/bench_gpu_steps.py (Keras training steps per device, and
#                     the MLP/CNN/LSTM in PyTorch CUDA where installed)
#   make bench-dist   data-parallel scaling: 1 process vs 2 MPI ranks (benches/bench_distributed.py)
#   make clean        remove build outputs (make distclean also removes .venv)
#
# Everything a fresh machine needs besides python3 (with venv + pip) and cargo is
# installed into .venv on first use.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
VENV_PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.stamp-deps
BUILD_STAMP := $(VENV)/.stamp-build
DEV_DEPS := maturin numpy pytest hypothesis scipy keras==2.3.1 h5py scikit-learn tensorboard \
            ruff mypy
# ferrokeras.distributed's tests launch `mpiexec -n 2`: MPICH from PyPI and mpi4py (the
# `mpi` extra), in a stamp of their own so that existing venvs get them too.
MPI_DEPS := mpi4py mpich
MPI_STAMP := $(VENV)/.stamp-mpi

# maturin must see the project venv, and only it (it refuses to run when a conda env is
# also active).
MATURIN := env -u CONDA_PREFIX VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin

# Devices the pytest suite runs on, one full pass each (FERROKERAS_DEVICE=<d>). The gpu
# pass runs every WGSL kernel, on Mesa llvmpipe where there is no GPU (CI sets
# FERROKERAS_REQUIRE_GPU=1 so a missing adapter fails instead of running on the CPU).
TEST_DEVICES ?= cpu gpu
PYTEST_ARGS ?= -q

# Older Keras releases that tests/keras also runs under, each in its own venv
# (.venv-keras224, .venv-keras225: Keras, its test dependencies and a .pth file putting
# this tree's python/ on the path, as `maturin develop` does for .venv), made on first use.
# One pass each, on KERAS_OLD_DEVICES, after the main suite. KERAS_OLD= skips them.
KERAS_OLD ?= 2.2.4 2.2.5
KERAS_OLD_DEVICES ?= cpu
KERAS_OLD_DEPS := numpy pytest scipy h5py scikit-learn tensorboard
KERAS_OLD_STAMPS := $(foreach v,$(KERAS_OLD),.venv-keras$(subst .,,$(v))/.stamp-deps)

# Inputs of the compiled extension. Python sources are not listed: `maturin develop`
# installs python/ferrokeras in editable mode, so edits there need no rebuild.
RUST_INPUTS := $(shell find src shaders -type f 2>/dev/null) \
               $(wildcard build.rs Cargo.toml Cargo.lock pyproject.toml)

# Rebuild if the installed extension has gone missing, whatever the stamp says.
ifeq ($(wildcard python/ferrokeras/_core*.so python/ferrokeras/_core*.pyd),)
.PHONY: $(BUILD_STAMP)
endif

.PHONY: help venv .venv build demo test lint wheel wheel-check bench bench-quick bench-venvs bench-profile bench-apps bench-conv bench-gpu bench-dist clean distclean

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

venv .venv: $(VENV_STAMP)

# The Makefile holds DEV_DEPS, so editing it brings an existing venv up to date.
$(VENV_STAMP): Makefile
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q $(DEV_DEPS)
	touch $@

build: $(BUILD_STAMP)

$(MPI_STAMP): $(VENV_STAMP)
	$(VENV)/bin/pip install -q $(MPI_DEPS)
	touch $@

$(BUILD_STAMP): $(VENV_STAMP) $(RUST_INPUTS)
	$(MATURIN) develop --release
	touch $@

demo: build
	$(VENV_PY) examples/quickstart.py
	KERAS_BACKEND=ferrokeras.backend $(VENV_PY) examples/digits_cnn.py

test: build $(KERAS_OLD_STAMPS) $(MPI_STAMP)
	cargo test --release --no-default-features
	cargo test --release --no-default-features --features gpu runtime::gpu::
	for d in $(TEST_DEVICES); do \
	  echo "== pytest, FERROKERAS_DEVICE=$$d"; \
	  FERROKERAS_DEVICE=$$d $(VENV_PY) -m pytest $(PYTEST_ARGS) tests; \
	done
	for v in $(KERAS_OLD); do for d in $(KERAS_OLD_DEVICES); do \
	  echo "== pytest tests/keras, Keras $$v, FERROKERAS_DEVICE=$$d"; \
	  env -u PYTHONPATH FERROKERAS_DEVICE=$$d .venv-keras$${v//./}/bin/python -m pytest \
	    $(PYTEST_ARGS) tests/keras; \
	done; done

# .venv-keras224/.stamp-deps installs Keras 2.2.4 (the digits of the name, dotted).
.venv-keras%/.stamp-deps:
	$(PYTHON) -m venv .venv-keras$*
	.venv-keras$*/bin/pip install -q keras==$$(sed -E 's/^(.)(.)(.+)$$/\1.\2.\3/' <<<'$*') \
	  $(KERAS_OLD_DEPS)
	echo "$(CURDIR)/python" > "$$(.venv-keras$*/bin/python -c \
	  'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ferrokeras.pth"
	touch $@

# Python sources and the stub are checked from the repository root; clippy runs over both
# feature sets (the bindings and GPU device, and the bare core that `cargo test` builds).
PY_SOURCES := python tests benches examples

lint: build
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings
	cargo clippy --release --all-targets --no-default-features -- -D warnings
	$(VENV)/bin/ruff check $(PY_SOURCES)
	$(VENV)/bin/ruff format --check $(PY_SOURCES)
	$(VENV_PY) -m mypy.stubtest ferrokeras._core

wheel: $(VENV_STAMP)
	rm -f dist/ferrokeras-*.whl
	$(MATURIN) build --release -o dist

# Proves the wheel is self-contained: fresh venv outside the repo, no Rust toolchain on
# PATH, the quickstart copied out of the source tree so nothing is imported from it.
wheel-check: wheel
	@whls=(dist/ferrokeras-*-abi3-*.whl); \
	if [ $${#whls[@]} -ne 1 ] || [ ! -f "$${whls[0]}" ]; then \
	  echo "wheel-check: expected exactly one abi3 wheel in dist/, found: $$(ls dist)"; exit 1; \
	fi; \
	whl="$(CURDIR)/$${whls[0]}"; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	echo "== wheel-check: $$whl in $$tmp"; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/pip" install -q "$$whl" numpy; \
	cp examples/quickstart.py "$$tmp/"; \
	norust=$$(tr ':' '\n' <<<"$$PATH" | while read -r d; do \
	  [ -n "$$d" ] && [ ! -e "$$d/cargo" ] && [ ! -e "$$d/rustc" ] && printf '%s:' "$$d"; done; true); \
	run() { (cd "$$tmp" && env -u CARGO_HOME -u RUSTUP_HOME -u PYTHONPATH -u VIRTUAL_ENV \
	  PATH="$$tmp/venv/bin:$${norust%:}" "$$@"); }; \
	if run /bin/sh -c 'command -v cargo || command -v rustc'; then \
	  echo "wheel-check: a Rust toolchain is still on PATH"; exit 1; fi; \
	run python -c 'import sys, ferrokeras._core as c; print("ferrokeras._core:", c.__file__); assert c.__file__.startswith(sys.prefix), "not from the test venv"'; \
	run python quickstart.py; \
	echo "== wheel-check passed"

# Peers for bench_keras.py, each in its own venv under benches/.venvs/ (gitignored), made
# on first use. A peer that fails to install (no disk, no network) is reported and skipped:
# its column reads n/a. BENCH_PEERS= (empty) runs ferrokeras alone; BENCH_ARGS is passed to
# bench_keras.py (e.g. BENCH_ARGS="--frameworks ferrokeras --workloads mlp,lstm").
BENCH_PEERS ?= tf jax torch
BENCH_COMMA := ,
BENCH_SPACE := $(subst ,, )
BENCH_ARGS ?=
# Non-empty: `make bench` also runs benches/bench_apps.py (ResNet50 and MobileNetV2 against
# TF when tf is among BENCH_PEERS, ~10 min; --quick with BENCH_ARGS=--quick).
BENCH_APPS ?=
BENCH_APPS_ARGS ?=
PEER_DIR := benches/.venvs
PEER_PKGS_tf := tensorflow-cpu tf-keras
PEER_PKGS_jax := keras 'jax[cpu]'
PEER_PKGS_torch := keras torch
PEER_PKGS_tools := py-spy
# Free disk (GiB) a peer install needs; torch brings several GB of CUDA libraries.
PEER_DISK_tf := 4
PEER_DISK_jax := 2
PEER_DISK_torch := 10
PEER_DISK_tools := 1
PROFILE_DIR ?= benches/out/profile

bench: build bench-venvs
	$(VENV_PY) benches/bench_core.py $(if $(findstring --quick,$(BENCH_ARGS)),--quick,)
	$(VENV_PY) benches/bench_keras.py --frameworks $(subst $(BENCH_SPACE),$(BENCH_COMMA),$(strip ferrokeras $(BENCH_PEERS))) $(BENCH_ARGS)
	$(if $(BENCH_APPS),$(VENV_PY) benches/bench_apps.py --frameworks $(subst $(BENCH_SPACE),$(BENCH_COMMA),$(strip ferrokeras $(filter tf,$(BENCH_PEERS)))) $(if $(findstring --quick,$(BENCH_ARGS)),--quick,),)

bench-quick:
	$(MAKE) bench BENCH_ARGS="--quick $(BENCH_ARGS)"

bench-venvs: $(foreach p,$(BENCH_PEERS),$(PEER_DIR)/$(p)/.stamp)

# The measurements behind docs/performance.md (py-spy comes from PyPI into $(PEER_DIR)/tools;
# its profiles go to $(PROFILE_DIR), under the git-ignored benches/out/).
bench-profile: build $(PEER_DIR)/tools/.stamp
	@mkdir -p $(PROFILE_DIR)
	for w in mlp lstm; do \
	  $(VENV_PY) benches/profile_step.py breakdown --workload $$w; \
	  $(PEER_DIR)/tools/bin/py-spy record --native --idle --format raw -r 200 -o $(PROFILE_DIR)/$$w.pyspy -- \
	    $(VENV_PY) benches/profile_step.py train --workload $$w --seconds 20; \
	  $(VENV_PY) benches/profile_summary.py $(PROFILE_DIR)/$$w.pyspy; \
	  $(VENV_PY) benches/profile_step.py ops --workload $$w; \
	done

$(PEER_DIR)/%/.stamp:
	@mkdir -p $(PEER_DIR)
	@free=$$(df -Pk $(PEER_DIR) | awk 'NR==2 {print int($$4/1048576)}'); \
	if [ "$$free" -lt "$(PEER_DISK_$*)" ]; then \
	  echo "!! bench peer '$*' skipped: $$free GiB free, it needs about $(PEER_DISK_$*) GiB"; \
	  echo "skipped: $$free GiB free, needs $(PEER_DISK_$*) GiB" > $(PEER_DIR)/$*.log; exit 0; fi; \
	echo "== bench peer '$*': pip install $(PEER_PKGS_$*) into $(PEER_DIR)/$* (log: $(PEER_DIR)/$*.log)"; \
	if $(PYTHON) -m venv $(PEER_DIR)/$* && \
	   $(PEER_DIR)/$*/bin/pip install -q --disable-pip-version-check $(PEER_PKGS_$*) numpy \
	     > $(PEER_DIR)/$*.log 2>&1; then \
	  touch $@; \
	else \
	  echo "!! bench peer '$*' failed to install (see $(PEER_DIR)/$*.log); its column will read n/a"; \
	fi

# keras.applications models against TF (benches/.venvs/tf), then where a ResNet50 training
# step spends its time in each, by op kind.
bench-apps: build $(PEER_DIR)/tf/.stamp
	$(VENV_PY) benches/bench_apps.py $(BENCH_APPS_ARGS)
	$(VENV_PY) benches/profile_apps.py

# The conv benchmark's peers are bench_keras's tf and torch venvs (torch from PyPI brings
# CUDA libraries; it runs on the CPU here).
bench-conv: build $(PEER_DIR)/tf/.stamp $(PEER_DIR)/torch/.stamp
	$(VENV_PY) benches/check_conv_vs_tf.py
	$(VENV_PY) benches/bench_conv.py

bench-gpu: build
	$(VENV_PY) benches/bench_gpu.py
	$(VENV_PY) benches/bench_gpu_steps.py

# As root, every rank runs at nice -20 in a scheduling group of its own (--priority), so
# the figures measure the ranks, not the machine's other jobs (docs/distributed.md).
BENCH_DIST_ARGS ?= $(if $(filter 0,$(shell id -u)),--priority,)
bench-dist: build $(MPI_STAMP)
	$(VENV_PY) benches/bench_distributed.py $(BENCH_DIST_ARGS)

clean:
	rm -rf target dist .pytest_cache .hypothesis $(BUILD_STAMP)
	rm -f python/ferrokeras/_core*.so python/ferrokeras/_core*.pyd
	find . -name __pycache__ -type d -not -path './.venv/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .venv-keras*/
