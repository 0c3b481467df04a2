"""The package's import graph: no circle, and no import from a lower layer to a higher one.

Every module of ``mgsr_lightning`` is read with ``ast``; an import anywhere in it counts (at the top,
inside a function, under ``if TYPE_CHECKING:``), and so does ``importlib.import_module("...")`` with
a literal name. ``import a.b.c`` or ``from a.b import c`` is an edge to the module ``a.b.c`` when
there is one, else to the package ``a.b``; a package's ``__init__`` is a node of its own.

The layers, lowest first; a module may import its own layer (without a circle) and the layers below.
Each is a folder of the package or a few root modules:

1. contract: ``batch`` (the tensors a training step passes around), ``errors``, ``missing``, ``atomic``,
   ``distributed``, ``seeding``, ``lightning_workarounds``, ``lazy`` (the packages' names imported on first
   use): the root helpers, which import nothing of the package beyond this layer.
2. losses: ``losses/`` (pure functions of logits; torch and ``batch`` only).
3. models: ``models/`` (loading, LoRA, tokenizers, checks without weights, export).
4. cross_tokenizer: ``cross_tokenizer/`` (two tokenizations of one text aligned, the shared vocabulary, SCRG's
   correction through text).
5. generation: ``generation/`` (the scoring forwards, the decode loop, sampling, KV caches).
6. method: ``spans/`` and ``scrg/``, MGSR's span and sequence levels.
7. data: ``data/`` (records, templates, collation, the data module, the benchmark generators in ``data/tasks/``).
8. evaluation: ``evaluation/`` (ROUGE-L over seeds, the evaluation sets, validation metrics, the report).
9. training: ``training/`` (regimes, rollouts, SeqKD's cache, optimiser, callbacks, resume state, FSDP).
10. module: ``module`` (the one LightningModule) and the package's ``__init__``, which re-exports it.
11. cli: ``cli/`` (LightningCLI, config files, validation, the run lock).
12. pipeline: ``pipeline/`` (multi-step commands built on the CLI) and ``__main__``.

A name covers the module and, for a package, everything under it. A new module needs a place here.

Besides the layers, the data line: the training side (``module``, ``training/``, ``scrg/``, ``spans/``,
``generation/`` and ``losses/``) imports nothing from ``data/`` or ``pipeline/``, so that importing the
LightningModule loads neither (nor ``pyarrow``); the tests of ``test_imports.py`` check what is loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "mgsr_lightning"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (  # lowest first
    ("contract", ("batch", "errors", "missing", "atomic", "distributed", "seeding", "lightning_workarounds", "lazy")),
    ("losses", ("losses",)),
    ("models", ("models",)),
    ("cross_tokenizer", ("cross_tokenizer",)),
    ("generation", ("generation",)),
    ("method", ("spans", "scrg")),
    ("data", ("data",)),
    ("evaluation", ("evaluation",)),
    ("training", ("training",)),
    ("module", ("module", "__init__")),
    ("cli", ("cli",)),
    ("pipeline", ("pipeline", "__main__")),
)


def package_modules() -> dict[str, Path]:
    """Dotted name -> file, for every module and package of the package."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(name: str, path: Path) -> set[str]:
    """The dotted names a module imports (only those inside the package), wherever the import stands."""
    is_package = path.name == "__init__.py"
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) + (1 if is_package else 0) - node.level]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.update(f"{module}.{alias.name}" for alias in node.names)
            names.add(module)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return {n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_names(name, path):
            if imported in modules:
                targets.add(imported)
            elif imported.rpartition(".")[0] in modules:  # ``from package import name``: the package
                targets.add(imported.rpartition(".")[0])
        # ``from a.b import c`` also gave ``a.b``: keep it only when nothing under it was named
        graph[name] = {t for t in targets if t != name and not any(o.startswith(t + ".") for o in targets)}
    return graph


def layer_of(name: str) -> int | None:
    """Index in LAYERS of the longest name there covering ``name`` (None: in no layer)."""
    relative = name[len(PACKAGE) + 1 :] if name != PACKAGE else "__init__"
    best = None
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            covers = relative == member or relative.startswith(member + ".")
            if covers and (best is None or len(member) > len(best[1])):
                best = (index, member)
    return None if best is None else best[0]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "mgsr_lightning.losses" in graph["mgsr_lightning.scrg.error_search"]  # from mgsr_lightning import losses
    assert "mgsr_lightning.losses.objective" in graph["mgsr_lightning.module"]  # from a.b.c import name
    assert "mgsr_lightning.cli.lightning_cli" in graph["mgsr_lightning.__main__"]  # inside a function
    assert "mgsr_lightning.module" in graph["mgsr_lightning"]  # under TYPE_CHECKING and import_module("...")
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_has_a_layer_and_every_layer_name_a_module():
    modules = package_modules()
    unplaced = [name for name in modules if layer_of(name) is None]
    assert not unplaced, f"give these modules a layer in LAYERS: {unplaced}"
    relative = {name[len(PACKAGE) + 1 :] if name != PACKAGE else "__init__" for name in modules}
    stale = [member for _, members in LAYERS for member in members
             if not any(r == member or r.startswith(member + ".") for r in relative)]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    graph = import_graph()
    unplaced = sorted({n for name, targets in graph.items() for n in (name, *targets) if layer_of(n) is None})
    assert not unplaced, f"modules with no layer in LAYERS (give them one): {unplaced}"
    upward = [
        f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for name, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(name)
    ]
    assert not upward, "\n".join(upward)


TRAINING_SIDE = ("module", "training", "scrg", "spans", "generation", "losses")
DATA_SIDE = ("data", "pipeline")


def _under(name: str, members: tuple[str, ...]) -> bool:
    relative = name[len(PACKAGE) + 1 :]
    return any(relative == member or relative.startswith(member + ".") for member in members)


def test_the_training_side_imports_nothing_from_data_or_pipeline():
    crossing = [f"{name} imports {target}" for name, targets in sorted(import_graph().items())
                if _under(name, TRAINING_SIDE) for target in sorted(targets) if _under(target, DATA_SIDE)]
    assert not crossing, "\n".join(crossing)


def test_package_inits_load_only_their_own_modules():
    """What a package's ``__init__`` imports when it runs (at its top level, not under ``if TYPE_CHECKING:``)
    is loaded by every import of a module inside it: only the package's own modules may be, and ``lazy`` (the
    standard-library helper that imports the package's names on first use)."""
    eager = {}
    for name, path in package_modules().items():
        if path.name != "__init__.py":
            continue
        body = ast.parse(path.read_text()).body
        imports = [node for node in body if isinstance(node, (ast.Import, ast.ImportFrom))]
        targets = [alias.name for node in imports if isinstance(node, ast.Import) for alias in node.names]
        targets += [node.module or "" for node in imports if isinstance(node, ast.ImportFrom) and not node.level]
        eager[name] = [t for t in targets if t.startswith(PACKAGE) and not t.startswith(name + ".")
                       and t != f"{PACKAGE}.lazy"]
    loaded = {name: targets for name, targets in eager.items() if targets}
    assert not loaded, f"package __init__s importing modules outside the package: {loaded}"
