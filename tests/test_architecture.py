"""The shape of the package, read from its source with ``ast`` (nothing is imported, nothing runs, but the tiny
models whose module and parameter names the architecture checks look for: ``architecture_names``).

Every import counts, those inside functions too: a module that imports another lazily still depends on it.
Each module sits above or below every other, never both; a bertgpu package (``bertgpu.parallel``,
``bertgpu.data``, ``bertgpu.tasks``) counts as one module for that too, so a top-level module does not reach
into a package that reaches back into it. A ``_name`` stays in its module. No command imports another command.
Each architecture lives in its folder (``bertgpu/models/<arch>/``): no module outside it imports it (the registry
aside, which imports its entry) or names its modules and parameters.
"""

from __future__ import annotations

import ast
import functools
import re
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


# --- each architecture in its own folder (issue 57) -------------------------------------------------------------


def folder_imports(imports: list[tuple[str, str, str | None, int, str | None]]) -> list[str]:
    """Imports of a module of an architecture's folder from outside it: from another architecture's folder, or
    from any other module but the registry, which imports each folder's package (its entry) and nothing deeper."""
    found = []
    for importer, imported, _, line, _ in imports:
        arch = architecture_of(imported)
        if arch is None or architecture_of(importer) == arch:
            continue
        if importer == REGISTRY and imported == f"bertgpu.models.{arch}":
            continue
        found.append(f"{importer}:{line} imports {imported}")
    return found


def test_no_module_outside_an_architectures_folder_imports_it():
    """The rest of bertgpu reaches an architecture through the registry (``architectures.of(config)``, its entry)
    and the model's declared interface (``interface.EncoderModel``), never by importing the folder's modules."""
    assert any(importer == REGISTRY and imported == "bertgpu.models.bert" for importer, imported, *_ in IMPORTS)
    found = folder_imports(IMPORTS)
    assert not found, "imports of an architecture's folder from outside it:\n" + "\n".join(found)


def test_the_folder_import_check_finds_each_kind():
    imports = [
        ("bertgpu.tasks.pretrain", "bertgpu.models.bert.model", "use_fused_qkv", 1, None),
        ("bertgpu.models.modernbert.model", "bertgpu.models.bert.model", "init_weights", 2, None),
        ("bertgpu.models.architectures", "bertgpu.models.bert.config", "BertConfig", 3, None),
        ("bertgpu.parallel.wrap", "bertgpu.models.modernbert", None, 4, "modernbert"),
        ("bertgpu.models.architectures", "bertgpu.models.modernbert", None, 5, "modernbert"),  # its entry: fine
        ("bertgpu.models.bert.model", "bertgpu.models.bert.config", "BertConfig", 6, None),  # its own folder: fine
        ("bertgpu.tasks.pretrain", "bertgpu.models.interface", "EncoderModel", 7, None),  # shared: fine
    ]
    assert [line.split(" ", 1)[0] for line in folder_imports(imports)] == [
        "bertgpu.tasks.pretrain:1",
        "bertgpu.models.modernbert.model:2",
        "bertgpu.models.architectures:3",
        "bertgpu.parallel.wrap:4",
    ]


@functools.cache
def architecture_names() -> dict[str, set[str]]:
    """Each architecture's module and parameter names (``bert.encoder.layer.0.attention.self.query``, ...), read
    from its tiny pretraining model and fine-tuning heads (on the CPU: the meta device would import torch._dynamo,
    3 s, where these take 1 s)."""
    from bertgpu.models import architectures

    names = {}
    for arch in architectures.ARCHS:
        config = architectures.preset(arch, "tiny", vocab_size=64)
        heads = [architectures.head_model(config, head) for head in architectures.by_name(arch).head_classes]
        models = [architectures.pretraining_model(config), *heads]
        names[arch] = {n for m in models for n, _ in (*m.named_modules(), *m.named_parameters()) if n}
    return names


def _runs(names: dict[str, set[str]]) -> tuple[dict[tuple[str, ...], str], set[str]]:
    """(every contiguous run of two or more components of a name -> its architecture, the generic components).

    Generic: a digit (a layer's index), or a component that every architecture's names share (weight, bias,
    dense, embeddings, decoder, classifier today): such a name says nothing of which architecture a model is, and
    code that serves all of them may write it (``".weight"``, lora.py's head ``"classifier"``). Every other
    component is one architecture's own (``layer`` is BERT's, ``layers`` ModernBERT's; ``encoder``, ``model``:
    where each holds its encoder), so a third architecture without, say, a ``decoder`` makes that one specific."""
    components = [{c for name in arch_names for c in name.split(".")} for arch_names in names.values()]
    generic = set.intersection(*components) | {str(i) for i in range(100)}
    runs = {}
    for arch, arch_names in names.items():
        for name in arch_names:
            parts = tuple(name.split("."))
            for i in range(len(parts)):
                for j in range(i + 2, len(parts) + 1):
                    if any(p not in generic for p in parts[i:j]):
                        runs.setdefault(parts[i:j], arch)
    return runs, generic


def _distinctive(names: dict[str, set[str]], generic: set[str]) -> dict[str, str]:
    """The single components that are one architecture's coinage -> its architecture: those with a capital or an
    underscore (``Wqkv``, ``Wi``, ``LayerNorm``, ``seq_relationship``, ``tok_embeddings``). A plain lowercase word
    (``bert``, ``model``, ``pooler``, ``query``, ``head``) is also an everyday identifier and value elsewhere
    (--pooling pooler, --lora-targets query,value, a "model" key): alone it names nothing; in a dotted run it does."""
    found = {}
    for arch, arch_names in names.items():
        for c in (c for name in arch_names for c in name.split(".")):
            if c not in generic and not (c.isalpha() and c.islower()):
                found.setdefault(c, arch)
    return found


_WORDS = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")


def _named(parts: list[str], runs: dict[tuple[str, ...], str]) -> str | None:
    """The architecture whose module or parameter path ``parts`` (components, in order) contains, or None."""
    for i in range(len(parts)):
        for j in range(len(parts), i + 1, -1):
            if tuple(parts[i:j]) in runs:
                return runs[tuple(parts[i:j])]
    return None


def architecture_paths(trees: dict[str, ast.AST], names: dict[str, set[str]]) -> list[str]:
    """Where a module outside the architectures' folders names an architecture's modules or parameters: a string
    literal holding a dotted run of a name's components (``"bert.encoder."``, ``"cls.seq_relationship"``, an
    f-string's ``".attn.Wqkv"``, the words of a message) or one of its distinctive components (``"Wqkv"``), or an
    attribute chain that does (``model.bert.pooler``, ``layer.attn.Wqkv``; a chain from an imported module, such
    as ``nn.LayerNorm``, is that module's). Docstrings and comments may name them. Sorted by module and line."""
    runs, generic = _runs(names)
    distinctive = _distinctive(names, generic)
    found = []
    for module, tree in trees.items():
        if architecture_of(module):
            continue
        docstrings = {
            id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
        }
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        imported = {
            (alias.asname or alias.name).split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for alias in n.names
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                # a distinctive component as the whole string: "Wqkv", an f-string's ".Wqkv"; in prose it is the
                # word (--weight-decay's help: "not on biases and LayerNorm")
                if arch := distinctive.get(node.value.strip(".")):
                    found.append((module, node.lineno, f"names {arch}'s {node.value!r}"))
                for word in _WORDS.findall(node.value):
                    if arch := _named(word.split("."), runs):
                        found.append((module, node.lineno, f"names {arch}'s {word!r}"))
            elif isinstance(node, ast.Attribute) and id(node) not in inner:
                chain, base = [], node
                while isinstance(base, ast.Attribute):
                    chain.insert(0, base.attr)
                    base = base.value
                if isinstance(base, ast.Name) and base.id in imported:
                    continue
                arch = _named(chain, runs) or next((distinctive[a] for a in chain if a in distinctive), None)
                if arch:
                    found.append((module, node.lineno, f"names {arch}'s {'.'.join(chain)}"))
    return [f"{module}:{line} {what}" for module, line, what in sorted(found)]


def test_no_module_outside_an_architectures_folder_names_its_modules_or_parameters():
    """Which modules and parameters a model has is its architecture's to say: the rest of bertgpu asks the model
    (``interface.EncoderModel``: ``mlm_head_prefixes``, ``nsp_head_prefixes``, ``vocab_rows``,
    ``encoder_layers()``, ``use_next_sentence()``, ...) or the registry's entry (``tp_plan``, ``lora_targets``)."""
    names = architecture_names()
    assert set(names) == _registry_names()
    assert {"bert.encoder.layer.0.attention.self.query.weight", "cls.seq_relationship"} <= names["bert"]
    assert {"model.layers.0.attn.Wqkv.weight", "head.dense"} <= names["modernbert"]
    found = architecture_paths(TREES, names)
    assert not found, "an architecture's module or parameter names outside its folder:\n" + "\n".join(found)


def test_the_path_check_finds_each_kind():
    """Each kind of naming that test above refuses is found, in a module of its own; generic names, docstrings
    and a library's attributes are not."""
    source = '''
"""A docstring may say cls.seq_relationship and Wqkv."""
import torch
from torch import nn
def f(model, name, missing, layer):
    """So may a function's: model.bert.pooler."""
    a = any(n.startswith("cls.seq_relationship") for n in missing)
    b = name.startswith("bert.encoder.")
    c = f"{name}.attn.Wqkv.weight"
    d = model.bert.pooler
    e = "Wqkv"
    g = model.cls.seq_relationship.weight.grad
    h = "no masked-LM head (cls.predictions.*): fill-mask needs one"
    i = layer.mlp.Wi
    j = name.endswith(("x.model.layers", "LayerNorm"))
    k = self.Wqkv
    ok = ("classifier.weight", ".weight", "layer", "model.safetensors", "bertgpu.models.bert.model", "query")
    ok = (nn.LayerNorm, torch.nn.attention, model.encoder_layers(), model.config.hidden_size, "e.g. 1.5", "pooler")
    ok = "weight decay, not on biases and LayerNorm"
'''
    found = architecture_paths({"bertgpu.somewhere": ast.parse(source)}, architecture_names())
    lines = [line.split(" ", 1)[0] for line in found]
    assert lines == [f"bertgpu.somewhere:{n}" for n in (7, 8, 9, 10, 11, 12, 13, 14, 15, 15, 16)], found


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


# --- each command's run built whole from its config sections (issue 57) ---------------------------------------

MAX_PARAMETERS = 8


def long_signatures(trees: dict[str, ast.AST]) -> list[str]:
    """Every function or method of more than ``MAX_PARAMETERS`` parameters: self and cls not counted, keyword-only
    ones counted, ``*args`` and ``**kwargs`` one each."""
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                count -= bool((a.posonlyargs or a.args) and (a.posonlyargs or a.args)[0].arg in ("self", "cls"))
                if count > MAX_PARAMETERS:
                    found.append(f"{module}:{node.lineno} {node.name} takes {count} parameters")
    return found


def test_no_function_takes_more_than_eight_parameters():
    """What travels together goes as one object, not threaded by hand: a config section, a small dataclass
    (``SpreadOptions``, ``checkpoint.ModelFiles``, ``checkpoint.Snapshot``, ``model_card.RunFacts``,
    ``launch.Elastic``), a command's ``common.Task``."""
    found = long_signatures(TREES)
    assert not found, f"more than {MAX_PARAMETERS} parameters:\n" + "\n".join(found)


def test_the_signature_check_counts_each_kind():
    source = """
def nine(a, b, c, d, e, f, g, h, i): ...
def eight(a, b, c, d, e, f, g, *, h): ...
def stars(a, b, c, d, e, f, g, *args, **kwargs): ...
async def waits(a, b, c, d, e, f, g, h, /, i): ...
class C:
    def method(self, a, b, c, d, e, f, g, h): ...
    def more(self, a, b, c, d, e, f, g, *, h, i): ...
    @classmethod
    def made(cls, a, b, c, d, e, f, g, h): ...
"""
    found = long_signatures({"bertgpu.somewhere": ast.parse(source)})
    assert [line.split(" ")[1] for line in found] == ["nine", "stars", "waits", "more"], found


def test_a_run_is_built_from_its_task_and_each_train_step_shows_its_optimizer_step():
    """``build_run`` is given the session and the command's task, made whole from the config: no callable is
    threaded in (no lambda among its arguments); and each loop's ``train_step`` reads as nanoGPT's and
    torchtitan's: forward and backward, then clip, the optimizer step, zero, the schedule, in that order."""
    calls = [
        node
        for tree in TREES.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "build_run"
    ]
    assert len(calls) >= 2
    for call in calls:
        given = [*call.args, *(k.value for k in call.keywords)]
        assert not any(isinstance(n, ast.Lambda) for arg in given for n in ast.walk(arg)), ast.unparse(call)
    wanted = ["opt.clip_grad_norm", "opt.step", "opt.zero_grad", "opt.schedule.step"]
    for name in ("bertgpu.tasks.pretrain", "bertgpu.tasks.finetune"):
        step = next(n for n in TREES[name].body if isinstance(n, ast.FunctionDef) and n.name == "train_step")
        called = [
            ast.unparse(n.func)
            for statement in step.body
            for n in ast.walk(statement)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        ]
        assert [c for c in called if c in wanted] == wanted, f"{name}.train_step calls {called}"
        before = called[: called.index(wanted[0])]
        assert any("forward_backward" in c for c in before), f"{name}.train_step: no forward and backward first"
