"""The package's layers, read from the source (no import runs): each module imports only
modules of its own layer or below, and no imports form a circle, function-local imports
included. A failure names both modules."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "neuroshard"

#: the layers, bottom first: a module's layer is the first prefix that matches its name
LAYERS: list[tuple[str, ...]] = [
    ("version", "errors", "units", "constants", "on_first_use", "validate", "io", "access_spec", "optimizers", "tiers", "model_spec", "faults",
     "types", "constraints", "tables", "topology", "provenance", "plan", "exporters"),
    ("datasets",),
    ("execution",),
    ("costmodels",),
    ("search",),
    ("measured",),
    ("runtime",),
    ("torchrec",),
    ("cli", "cli_options", "plan_cli", "demo", "__init__"),
]
#: command-line modules (``*cli*.py``) sit on top whatever package they are in
CLI_SUFFIX = "cli"
#: a function-local import of the package's own modules is allowed only here (CLI start-up,
#: and the root ``neuroshard.shard``, which keeps ``import neuroshard`` free of torch)
LOCAL_IMPORTS_ALLOWED = {"__init__"}
#: a package's table of names loaded from its submodules on first use (``neuroshard.on_first_use``)
LAZY_TABLE = "_ON_FIRST_USE"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _layer(module: str) -> int:
    if module.rpartition(".")[2].endswith(CLI_SUFFIX) or module.rpartition(".")[2] == "cli_options":
        return len(LAYERS) - 1
    for i, names in enumerate(LAYERS):
        if module.split(".")[0] in names:
            return i
    raise AssertionError(f"module neuroshard.{module} is in no layer: add it to LAYERS in {__file__}")


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported module of the package, whether the import is inside a function)."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, bool]] = []

    def resolve(node: ast.ImportFrom) -> list[str]:
        if node.level:
            base = module.split(".") if (is_package and module != "__init__") else module.split(".")[:-1]
            if module == "__init__":
                base = []
            base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
            prefix = ".".join(base + ([node.module] if node.module else []))
        elif (node.module or "").startswith("neuroshard"):
            prefix = node.module[len("neuroshard"):].lstrip(".")
        else:
            return []
        names = [f"{prefix}.{a.name}".lstrip(".") for a in node.names] + [prefix]
        out = []
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.append(name)
        return out[:1] if out else []

    def walk(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            checking = type_checking or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.ImportFrom) and not checking:
                found.extend((m, in_function) for m in resolve(child))
            elif isinstance(child, ast.Import) and not checking:
                for alias in child.names:
                    if alias.name.startswith("neuroshard."):
                        name = alias.name[len("neuroshard."):]
                        while name and name not in MODULES:
                            name = name.rpartition(".")[0]
                        if name:
                            found.append((name, in_function))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)), checking)

    walk(tree, False, False)
    if is_package:  # names handed out on first use (neuroshard.on_first_use): imports of its submodules
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == LAZY_TABLE for t in node.targets):
                value = node.value
                values = value.values if isinstance(value, ast.Dict) else [getattr(value, "value", None)]
                for v in values:
                    assert isinstance(v, ast.Constant), f"{path}: {LAZY_TABLE} must map names to module names"
                    found.append((f"{module}.{v.value}".lstrip("."), False))
    return found


def climbing(imports: dict[str, list[tuple[str, bool]]]) -> list[str]:
    """Every import of a module from a layer above its own, as 'A (layer i) imports B (layer j)'."""
    out = []
    for module, targets in imports.items():
        for target, _ in targets:
            if module.startswith(target + ".") and MODULES.get(target, Path("x")).name == "__init__.py":
                continue  # a module reading its own package's __init__
            if _layer(target) > _layer(module):
                out.append(f"neuroshard.{module} (layer {_layer(module)}) imports neuroshard.{target} "
                           f"(layer {_layer(target)})")
    return out


def circle(imports: dict[str, list[tuple[str, bool]]]) -> list[str] | None:
    """One import circle (its modules in order, back to the first), or None."""
    graph = {m: {t for t, _ in targets if not (MODULES.get(m, Path("x")).name == "__init__.py"
                                              and t.startswith(m + "."))}
             for m, targets in imports.items()}
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return None


IMPORTS = {m: _imports(m) for m in MODULES}


def test_every_import_goes_down_or_across_its_layer():
    found = climbing(IMPORTS)
    assert not found, "imports climb layers:\n" + "\n".join(found)


def test_no_import_circle_function_local_imports_included():
    found = circle(IMPORTS)
    assert found is None, "import circle: " + " -> ".join(f"neuroshard.{m}" for m in found)


def test_function_local_imports_of_own_modules_only_at_start_up():
    local = [f"neuroshard.{module} imports neuroshard.{target} inside a function"
             for module, targets in IMPORTS.items()
             if module not in LOCAL_IMPORTS_ALLOWED and _layer(module) != len(LAYERS) - 1
             for target, inside in targets if inside]
    assert not local, "\n".join(local)


def test_the_checks_find_a_climbing_import_and_a_circle():
    """The checks can fail: a search module importing the measured loop, and two modules
    importing each other (one inside a function), are reported by name."""
    fake = {"search.api": [("measured.api", True)], "measured.api": [("search.api", False)]}
    assert climbing(fake) == ["neuroshard.search.api (layer 4) imports neuroshard.measured.api (layer 5)"]
    assert circle(fake) in (["search.api", "measured.api", "search.api"], ["measured.api", "search.api", "measured.api"])
    assert ("search.simulator", False) in IMPORTS["search.api"]  # the reader sees relative imports
    assert ("costmodels.loading", False) in IMPORTS["costmodels"]  # ... and the names loaded on first use


def test_the_command_line_parser_imports_no_heavy_library():
    """``neuroshard --help`` and every ``COMMAND --help`` build the whole parser: it must not
    import scikit-learn, pandas, torch or the search (they made ``--help`` take 1.5 s)."""
    import subprocess
    import sys
    code = ("import sys; from neuroshard.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('sklearn', 'pandas', 'scipy', 'torch', 'optuna', 'matplotlib', "
            "'neuroshard.search.api', 'neuroshard.costmodels.base') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"building the parser imported {out.strip()}"
