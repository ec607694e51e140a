"""The code's structure, read mechanically. The Rust layers of src/ use only the layers below
them; the Python facade's modules import each other at
top level in one direction only, and ``ferrokeras.backend`` exports exactly the public names
of the ``K`` families.
"""

import ast
import importlib
import re
from pathlib import Path

import ferrokeras
from ferrokeras import backend as K

PACKAGE = Path(ferrokeras.__file__).parent


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name):
    base = PACKAGE.parent / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _imports():
    """{module: [(imported module, line, at top level)]} over the ferrokeras package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body}
        edges = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    target = ".".join(parts + ([node.module] if node.module else []))
                elif (node.module or "").startswith("ferrokeras"):
                    target = node.module
                else:
                    continue
                for alias in node.names:  # `from . import x` names a submodule when x is one
                    sub = f"{target}.{alias.name}"
                    edges.append((sub if _is_module(sub) else target, node.lineno, id(node) in top))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("ferrokeras"):
                        edges.append((alias.name, node.lineno, id(node) in top))
        out[module] = edges
    return out


IMPORTS = _imports()


def test_the_import_graph_is_read():
    assert "ferrokeras._k.math" in IMPORTS and "ferrokeras.backend" in IMPORTS
    assert any(t == "ferrokeras._k.variables" for t, _, _ in IMPORTS["ferrokeras._k.math"])


def test_k_families_import_only_at_top_level():
    """A function-level import of a sibling is how an import cycle hides; the families form
    a DAG instead (the one lazy import is ``ferrokeras.callbacks``, which loads the
    tensorboard package only once Keras runs on ferrokeras)."""
    lazy = [
        f"{module}:{line} imports {target}"
        for module, edges in IMPORTS.items()
        for target, line, top in edges
        if not top
        and target.startswith("ferrokeras.")
        and not (module == "ferrokeras._keras2" and target == "ferrokeras.callbacks")
        and not (module == "ferrokeras" and target == "ferrokeras.backend")
    ]
    assert lazy == []


def test_top_level_imports_form_a_dag():
    graph = {
        m: {t for t, _, top in e if top and t in IMPORTS and t != m} for m, e in IMPORTS.items()
    }
    # A package's __init__ importing its own submodules is not a cycle of the families.
    state, cycle = {}, []

    def visit(m, path):
        state[m] = "open"
        for t in sorted(graph.get(m, ())):
            if t == "ferrokeras" or m.startswith(t + "."):
                continue
            if state.get(t) == "open":
                cycle.append(path + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycle == []


def _family_names():
    names = set()
    for path in sorted((PACKAGE / "_k").glob("*.py")):
        module = importlib.import_module(_module_name(path))
        names |= set(getattr(module, "__all__", ()))
    return names


def test_backend_exports_every_public_family_name_and_nothing_private():
    exported = set(K.__all__)
    assert not [n for n in exported if n.startswith("_")]
    assert sorted(_family_names() - exported) == []
    for name in exported:
        assert hasattr(K, name), name


# ---- the Rust core -------------------------------------------------------------------------

SRC = Path(__file__).resolve().parent.parent / "src"

# The layers of src/, lowest first: each may use only those before it (docs/architecture.md).
LAYERS = ["base", "ops", "autodiff", "compile", "runtime", "py"]


def _rust_uses():
    """{(file under src/, layer it uses)} for every `crate::<layer>` path in the code."""
    uses = set()
    for path in sorted(SRC.rglob("*.rs")):
        rel = path.relative_to(SRC).as_posix()
        layer = rel.split("/")[0]
        if layer not in LAYERS:
            continue
        for target in re.findall(r"\bcrate::(\w+)", path.read_text()):
            if target in LAYERS and target != layer:
                uses.add((rel, layer, target))
    return uses


def test_the_rust_layers_are_read():
    uses = _rust_uses()
    assert ("runtime/cpu/mod.rs", "runtime", "compile") in uses
    assert ("ops/mod.rs", "ops", "base") in uses


def test_rust_layers_use_only_the_layers_below():
    upward = {
        (rel, target)
        for rel, layer, target in _rust_uses()
        if LAYERS.index(target) > LAYERS.index(layer)
    }
    assert sorted(upward) == []
