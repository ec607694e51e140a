"""Mesa's LLVM-based Vulkan drivers (llvmpipe, RADV) are not loaded next to another LLVM
in the global symbol scope, as TensorFlow's `libtensorflow_framework` exports one: the
driver's `libLLVM` would bind to that copy's objects, and the process would abort at exit.
A stand-in library that defines one of LLVM's symbols plays TensorFlow's part here."""

import json
import os
import shutil
import subprocess
import sys

import ferrokeras
import pytest

SOFTWARE = [d for d in ferrokeras.devices() if d.get("software")]
WARNING = "another copy of LLVM is loaded"


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in library")
    d = tmp_path_factory.mktemp("llvm")
    src = d / "stand_in.c"
    src.write_text("void _ZN4llvm2cl6Option11addArgumentEv(void) {}\n")
    so = d / "libstand_in_llvm.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return str(so)


def _child(code, env=None):
    """Runs `code` in a fresh interpreter; returns (device list it prints, stderr)."""
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"exit status {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _load(so):
    return f"import ctypes; ctypes.CDLL({so!r}, mode=ctypes.RTLD_GLOBAL)\n"


LIST = "import ferrokeras, json; print(json.dumps(ferrokeras.devices()))\n"


def test_llvm_drivers_are_skipped_after_another_llvm(stand_in):
    devices, err = _child(_load(stand_in) + LIST)
    assert not [d for d in devices if d.get("software")], devices
    if SOFTWARE:
        # A build with the GPU runtime on a machine with Mesa's llvmpipe: it was skipped,
        # and the process says why.
        assert WARNING in err, err
        assert "VK_LOADER_DRIVERS_DISABLE" in err


def test_the_stand_in_leaves_the_environment_as_it_was(stand_in):
    code = _load(stand_in) + "import ferrokeras, os; ferrokeras.devices()\n"
    code += "import json; print(json.dumps(os.environ.get('VK_LOADER_DRIVERS_DISABLE')))\n"
    value, _ = _child(code, {})
    assert value is None


def test_a_user_setting_decides(stand_in):
    devices, err = _child(_load(stand_in) + LIST, {"VK_LOADER_DRIVERS_DISABLE": ""})
    assert WARNING not in err
    assert devices == ferrokeras.devices()


def test_drivers_loaded_before_the_other_llvm_stay(stand_in):
    code = "import ferrokeras\nferrokeras.devices()\n" + _load(stand_in) + LIST
    devices, err = _child(code)
    assert WARNING not in err
    assert devices == ferrokeras.devices()
