"""The shape of the package, read from its source with ``ast`` (nothing is imported, nothing runs).

Every import counts, those inside functions too: a module that imports another lazily still depends on it.
Each module sits above or below every other, never both; a bertgpu package (``bertgpu.parallel``,
``bertgpu.data``, ``bertgpu.tasks``) counts as one module for that too, so a top-level module does not reach
into a package that reaches back into it. A ``_name`` stays in its module. No command imports another command.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bertgpu"

ALLOWED_PRIVATE: set[tuple[str, str, str]] = set()  # (importer, imported, name): none


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of bertgpu: its dotted name -> (file, whether it is a package's __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, (path, _) in MODULES.items()}


def _imports() -> list[tuple[str, str, str | None, int, str | None]]:
    """(importer, imported module, the name taken from it or None, line, the local name a module is bound to
    or None) for every import of a bertgpu module."""
    found = []
    for name, (_, package) in MODULES.items():
        here = name if package else name.rpartition(".")[0]
        for node in ast.walk(TREES[name]):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "bertgpu":
                        found.append((name, alias.name, None, node.lineno, alias.asname))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "bertgpu":
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" in MODULES:  # from . import launch: the module itself
                        found.append((name, f"{target}.{alias.name}", None, node.lineno, alias.asname or alias.name))
                    else:
                        found.append((name, target, alias.name, node.lineno, None))
    return found


IMPORTS = _imports()


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as the modules along it (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def _where(edges: list[tuple[str, str]], of) -> str:
    lines = {}
    for importer, imported, _, line, _ in IMPORTS:
        if (of(importer), of(imported)) in edges:
            lines.setdefault((of(importer), of(imported)), []).append(f"{importer}:{line} imports {imported}")
    return "\n".join(dict.fromkeys(line for edge in edges for line in lines[edge]))


def _assert_no_cycle(of) -> None:
    edges: dict[str, set[str]] = {}
    for importer, imported, _, _, _ in IMPORTS:
        if of(importer) != of(imported):
            edges.setdefault(of(importer), set()).add(of(imported))
    cycle = _cycle(edges)
    assert cycle is None, "an import circle: " + " -> ".join(cycle) + "\n" + _where(list(zip(cycle, cycle[1:])), of)


def test_the_imports_are_read():
    """The graph this file checks is the package's: a few imports every reader of bertgpu knows are in it."""
    pairs = {(importer, imported) for importer, imported, _, _, _ in IMPORTS}
    assert ("bertgpu.models.bert.model", "bertgpu.models.bert.config") in pairs
    assert ("bertgpu.tasks.pretrain", "bertgpu.tasks.common") in pairs  # from .common import ...
    assert ("bertgpu.parallel.layout", "bertgpu.parallel.launch") in pairs  # from . import launch
    assert ("bertgpu", "bertgpu.tasks.pretrain") in pairs  # inside a function
    assert len(MODULES) > 50


def test_no_module_imports_one_that_imports_it():
    _assert_no_cycle(lambda module: module)


def test_no_package_imports_one_that_imports_it():
    """bertgpu.models, bertgpu.training, bertgpu.checkpoints, bertgpu.parallel, bertgpu.data and bertgpu.tasks each
    as one node: checkpoints/ may use parallel/ or parallel/ checkpoints/, not both."""
    _assert_no_cycle(lambda module: ".".join(module.split(".")[:2]))


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}}) is None


def test_no_module_takes_another_ones_private_name():
    taken = [
        f"{importer}:{line} takes {name} from {imported}"
        for importer, imported, name, line, _ in IMPORTS
        if name and name.startswith("_") and not name.startswith("__") and importer != imported
        if (importer, imported, name) not in ALLOWED_PRIVATE
    ]
    # module._name, where a name is bound to a bertgpu module (from . import launch; launch._x)
    for name, tree in TREES.items():
        bound = {local for importer, _, _, _, local in IMPORTS if importer == name and local}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                taken.append(f"{name}:{node.lineno} takes {node.value.id}.{node.attr}")
    assert not taken, "\n".join(taken)


def test_no_command_imports_another():
    """The tasks that bertgpu.cli runs share what they share through modules of their own (tasks/common.py,
    ...), never through each other."""
    commands = {imported for importer, imported, _, _, _ in IMPORTS if importer == "bertgpu.cli"}
    commands = {m for m in commands if m.startswith("bertgpu.tasks.")}
    assert {"bertgpu.tasks.pretrain", "bertgpu.tasks.finetune", "bertgpu.tasks.predict"} <= commands
    crossing = [
        f"{importer}:{line} imports {imported}"
        for importer, imported, _, line, _ in IMPORTS
        if importer in commands and imported in commands and importer != imported
    ]
    assert not crossing, "\n".join(dict.fromkeys(crossing))


def test_the_models_know_nothing_of_files_processes_or_the_command_line():
    """Each architecture's model.py is computation: no torch.distributed, no checkpoint or Hugging Face
    directory, no CLI; and no module of bertgpu imports the CLI (it sits on top)."""
    models = [f"bertgpu.models.{arch}.model" for arch in _registry_names()]
    assert len(models) >= 2
    for name in models:
        for node in ast.walk(TREES[name]):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("torch.distributed") for a in node.names), f"{name}:{node.lineno}"
            elif isinstance(node, ast.ImportFrom) and not node.level:
                assert not (node.module or "").startswith("torch.distributed"), f"{name}:{node.lineno}"
        imported = {imp for importer, imp, _, _, _ in IMPORTS if importer == name}
        assert not imported & {
            "bertgpu.checkpoints.checkpoint",
            "bertgpu.checkpoints.hf_dir",
            "bertgpu.cli",
            "bertgpu.atomic",
        }, name
        assert not any(m.startswith(("bertgpu.parallel", "bertgpu.tasks")) for m in imported), name
    users = [f"{importer}:{line}" for importer, imported, _, line, _ in IMPORTS if imported == "bertgpu.cli"]
    assert users == ["bertgpu.__main__:1"]


# --- one registry entry per architecture (issue 39) -------------------------------------------------------------

# The modules that may say which architecture something is: the registry, and each architecture's own folder
# (bertgpu/models/<arch>/: its config, model, pipeline stages and registry entry).
REGISTRY = "bertgpu.models.architectures"
MODELS = PACKAGE / "models"


def architecture_of(module: str) -> str | None:
    """The architecture whose folder holds ``module``, or None."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["bertgpu", "models"] and (MODELS / parts[2] / "__init__.py").exists():
        return parts[2]
    return None


def architecture_files() -> set[str]:
    return {REGISTRY} | {m for m in MODULES if architecture_of(m)}


# getattr/hasattr on a model that ask what is around it or attached to it, not what it is: (module, function).
PROBES_ALLOWED = {
    (
        "bertgpu.checkpoints.hf_dir",
        "unwrap",
    ): "DistributedDataParallel's .module and torch.compile's ._orig_mod, around any model",
    ("bertgpu.training.lora", "is_lora"): "the peft_config PEFT leaves on any model it adapts",
    ("bertgpu.training.lora", "is_quantized"): "the mark lora.quantize leaves on any model it quantises",
}


def _registry_names() -> set[str]:
    """The architectures' names: the folders of bertgpu/models/ that are packages."""
    return {p.parent.name for p in MODELS.glob("*/__init__.py")}


def _architecture_classes() -> set[str]:
    """The classes of an architecture: every class of its own folder (its config class included)."""
    return {
        n.name
        for module in MODULES
        if architecture_of(module)
        for n in ast.walk(TREES[module])
        if isinstance(n, ast.ClassDef)
    }


def _names_in(node: ast.AST) -> set[str]:
    """The identifiers an expression reads (names, attributes, and string keys such as d.get("model_type"))."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.Attribute):
            found.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            found.add(n.value)
    return found


def _strings(node: ast.AST) -> set[str]:
    """The string literals of an operand: itself, or the items of a tuple, list or set."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node inside a module-level function or a method of a module-level class -> that function's name."""
    where: dict[ast.AST, str] = {}
    for top in ast.iter_child_nodes(tree):
        functions = top.body if isinstance(top, ast.ClassDef) else [top]
        for function in functions:
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                where.update((node, function.name) for node in ast.walk(function))
    return where


def architecture_branches(trees: dict[str, ast.AST]) -> list[str]:
    """Where a module outside the architectures' files asks which architecture something is: a model_type compared
    with a literal, an --arch (any value) compared with an architecture's name, isinstance/issubclass with an
    architecture's class, or getattr/hasattr probing a model or a config for what it has."""
    archs, classes = _registry_names(), _architecture_classes()
    found = []
    for module, tree in trees.items():
        if module in architecture_files():
            continue
        where = _functions(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                literals = set().union(*(_strings(o) for o in operands))
                if literals & archs:
                    found.append(f"{module}:{node.lineno} compares with {sorted(literals & archs)}")
                elif literals and any("model_type" in _names_in(o) for o in operands):
                    found.append(f"{module}:{node.lineno} compares a model_type with a literal")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                    named = {n for n in _names_in(node.args[1]) if n in classes}
                    if named:
                        found.append(f"{module}:{node.lineno} {node.func.id}(..., {sorted(named)})")
                elif node.func.id in ("getattr", "hasattr") and (module, where.get(node, "")) not in PROBES_ALLOWED:
                    subject = _names_in(node.args[0]) - _strings(node.args[0])
                    if any("model" in n or "config" in n for n in subject):
                        found.append(f"{module}:{node.lineno} {node.func.id}({ast.unparse(node.args[0])}, ...)")
    return found


def test_no_module_but_the_registry_and_an_architectures_own_asks_which_architecture():
    """Architecture knowledge is architectures.ARCHITECTURES' entries and the architectures' own folders;
    everywhere else a module asks the entry (architectures.of(config)) or calls the model's
    declared interface (model_interface.EncoderModel). Config fields that define values (model_type ClassVars,
    --arch's choices) are no comparison and pass."""
    assert _registry_names() >= {"bert", "modernbert"}
    assert {"BertForPreTraining", "ModernBertForMaskedLM", "BertConfig", "ModernBertConfig"} <= _architecture_classes()
    found = architecture_branches(TREES)
    assert not found, "branches on the architecture outside the registry:\n" + "\n".join(found)


def test_the_branch_check_finds_each_kind():
    """Each kind of branch that test above refuses, in a module of its own, is found; a generic one is not."""
    source = """
def f(cfg, config, model, d, cls):
    a = cfg.arch == "modernbert"
    b = config.model_type != "bert"
    c = d.get("model_type") in ("roberta",)
    e = isinstance(model, BertForPreTraining)
    g = hasattr(model, "decoder")
    h = getattr(unwrap(model), "gather_stages", None)
    ok = d.get("model_type") != cls.model_type and getattr(cfg, "steps", 0) and cfg.recipe == "fast"
"""
    found = architecture_branches({"bertgpu.somewhere": ast.parse(source)})
    assert [line.split(" ", 1)[0] for line in found] == [f"bertgpu.somewhere:{n}" for n in (3, 4, 5, 6, 7, 8)], found


def test_the_training_loops_read_as_the_algorithm():
    """pretrain's and finetune's train() read at once (issue 39): a builder makes the run's parts, then the loop;
    the loop asks the run's parts and writes none of their fields (``run.X = ...``), and no class is over 250
    lines."""
    for name in ("bertgpu.tasks.pretrain", "bertgpu.tasks.finetune"):
        train = next(n for n in TREES[name].body if isinstance(n, ast.FunctionDef) and n.name == "train")
        assert train.end_lineno - train.lineno + 1 <= 60, f"{name}.train: {train.end_lineno - train.lineno + 1} lines"
        for node in ast.walk(TREES[name]):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AugAssign)
                else []
            )
            for target in targets:
                while isinstance(target, ast.Attribute):
                    target = target.value
                    assert not (isinstance(target, ast.Name) and target.id in ("run", "session")), (
                        f"{name}:{node.lineno} writes a field of the run"
                    )
    long = {
        f"{name}.{node.name}"
        for name, tree in TREES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250
    }
    assert not long, sorted(long)


def test_the_parts_of_a_run_are_built_whole():
    """Each part of a training run (tasks/common.py, plan.py) sets its fields in its constructor: a method may
    change a field, never add one, so no part is half made between calls in a documented order (issue 39)."""
    for name in ("bertgpu.tasks.common", "bertgpu.training.plan"):
        for cls in (n for n in TREES[name].body if isinstance(n, ast.ClassDef)):
            # a dataclass's fields are made by its generated constructor
            made = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            added = []
            for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                for node in ast.walk(method):
                    targets = node.targets if isinstance(node, ast.Assign) else []
                    targets += [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                    for target in targets:
                        for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                if method.name == "__init__":
                                    made.add(t.attr)
                                elif t.attr not in made:
                                    added.append(f"{name}.{cls.name}.{method.name}:{node.lineno} sets self.{t.attr}")
            assert not added, "\n".join(added)
