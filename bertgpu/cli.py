"""The `bertgpu` command. Its flags are generated from the config dataclasses (bertgpu.config), so an
option is documented in one place only: the field's ``help``.

Nothing imports this module; it only turns argv into configs and calls the tasks.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from bertgpu import __version__
from bertgpu.config import (
    BenchConfig,
    EvaluateConfig,
    FillMaskConfig,
    FinetuneConfig,
    InspectConfig,
    PredictConfig,
    PrepareConfig,
    PretrainConfig,
    VocabConfig,
)
from bertgpu.errors import UserError, did_you_mean, nearest
from bertgpu.paths import refuse_clobbering


def _unwrap_optional(t: Any) -> tuple[Any, bool]:
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return t, False


def add_config_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    positional: typing.Collection[str] = (),
    skip: typing.Collection[str] = (),
) -> None:
    """One flag per dataclass field (nested dataclasses flattened), from the field's metadata.

    A nested dataclass field may list, in its own metadata, fields of it to give as positional
    arguments here (``positional``: one value each) and fields this command leaves out (``skip``:
    they keep their defaults)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if f.name in skip or f.metadata.get("internal"):  # internal: filled by the CLI (PretrainConfig.given)
            continue
        if dataclasses.is_dataclass(t):
            add_config_arguments(parser, t, f.metadata.get("positional", ()), f.metadata.get("skip", ()))
            continue
        meta = f.metadata
        help_text = meta.get("help", "").replace("%", "%%")  # argparse %-formats help: a percent is a literal
        if f.name in positional:
            parser.add_argument(f.name, metavar=f.name.upper(), help=help_text)
            continue
        if meta.get("positional"):
            parser.add_argument(f.name, nargs=meta.get("nargs", "+"), help=help_text)
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        base, optional = _unwrap_optional(t)
        kwargs: dict[str, Any] = {"dest": f.name, "help": help_text, "default": default}
        if base is bool:
            if optional:
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["action"] = "store_false" if default else "store_true"
        else:
            kwargs["type"] = meta.get("cli_type", base)
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
            if meta.get("required"):
                kwargs["required"] = True
                kwargs.pop("default")
            elif default not in (None, "", []):
                kwargs["help"] += f" (default: {default})".replace("%", "%%")
        parser.add_argument(flag, **kwargs)


def _sections(cls: type) -> dict[str, type]:
    """The nested config sections of a command's config: field name -> dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


def _flag_fields(cls: type) -> dict[str, tuple[Any, dataclasses.Field]]:
    """Every field a command's flags set, nested sections flattened (flags are flat): name -> (type, field)."""
    hints = typing.get_type_hints(cls)
    names = {f.name: (hints[f.name], f) for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])}
    for section in _sections(cls).values():
        names |= _flag_fields(section)
    return names


_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _config_value(where: str, value: Any, t: Any, f: dataclasses.Field) -> Any:
    """A --config file's value for a field of type ``t``, as a flag would give it (a string is converted as the
    flag converts what is typed: "1e-4" is a number), or a UserError naming the key, the value and the type
    it needs (argparse would blame the flag, which the user never typed, under a page of usage)."""
    from bertgpu.training.batch import parse_batch_sizes

    base, optional = _unwrap_optional(t)
    shown = json.dumps(value, ensure_ascii=False)
    if value is None:
        if optional or base is str:  # a str field's None is its own default (a checkpoint's bertgpu.json)
            return value
        raise UserError(f"{where}: null is not {_EXPECTED.get(base, 'a value')}")
    if f.metadata.get("cli_type") is str and typing.get_origin(base) in (typing.Union, types.UnionType):
        # --batch-size: one number, or one per data-parallel rank ("48,16" or a list)
        try:
            if isinstance(value, bool) or not isinstance(value, (int, str, list)):
                raise UserError(value)
            parse_batch_sizes(value)
        except UserError:
            raise UserError(
                f"{where}: {shown} is not a batch size (a number, or one per data-parallel rank: 48,16)"
            ) from None
        return value
    if typing.get_origin(base) is list:
        if isinstance(value, str):  # one item
            value = [value]
        if not isinstance(value, list) or any(isinstance(v, (bool, list, dict)) or v is None for v in value):
            raise UserError(f"{where}: {shown} is not a list of strings")
        return [str(v) for v in value]
    if base is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: {shown} is not true or false")
        return value
    if base in (int, float):
        if isinstance(value, str):
            try:
                return base(value.strip())
            except ValueError:
                pass
        elif not isinstance(value, bool) and isinstance(value, (int, float) if base is float else int):
            return value
        raise UserError(f"{where}: {shown} is not {_EXPECTED[base]}")
    if base is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise UserError(f"{where}: {shown} is not a string")
        value = str(value)  # as typed: --time-budget 300
        choices = [str(c) for c in f.metadata.get("choices") or ()]
        if choices and value not in choices:
            raise UserError(f"{where}: {shown} is not one of {', '.join(choices)}{did_you_mean(value, choices)}")
        return value
    return value


def read_config_file(path: str, command: str, cls: type) -> dict[str, Any]:
    """The fields of a --config file (JSON or YAML; flat, or nested in the config's sections, as a
    checkpoint's bertgpu.json holds them), as flag destinations -> values."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise UserError(f"--config {path}: {e.strerror or e}") from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise UserError(f"--config {path}: not valid YAML ({' '.join(str(e).split())})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"--config {path}: not valid JSON ({e}); YAML files end in .yaml or .yml") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict) and "step" in data:
        # A checkpoint's bertgpu.json: re-run that run. Whether to resume or start afresh is the caller's choice
        # (in the run section, or at the top level in a run saved before there was one).
        data = {k: v for k, v in data["config"].items() if k not in ("resume", "overwrite")}
        if isinstance(data.get("run"), dict):
            data["run"] = {k: v for k, v in data["run"].items() if k not in ("resume", "overwrite")}
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a mapping of field names to values")
    names = _flag_fields(cls)
    negated = _negated_flags(names)
    flat: dict[str, Any] = {}
    keys: dict[str, str] = {}  # field -> the key that set it, to name two that contradict each other

    def set_field(name: str, value: Any, key: str) -> None:
        if name in flat and flat[name] != value:
            raise UserError(f"--config {path}: {keys[name]} and {key} contradict each other: give one")
        flat[name], keys[name] = value, key

    def add(mapping: dict[str, Any], section: type, prefix: str) -> None:
        for key, value in mapping.items():
            name = str(key).replace("-", "_").lstrip("_")
            where = f"--config {path}: {prefix}{key}"
            if name in _sections(section) and isinstance(value, dict):
                add(value, _sections(section)[name], f"{prefix}{key}.")
            elif name in names:
                set_field(name, _config_value(where, value, *names[name]), f"{prefix}{key}")
            elif name in negated:  # a flag's own name, as the docs call keys: no-nsp: true is nsp: false
                field_name = negated[name]
                set_field(field_name, not _config_value(where, value, bool, names[field_name][1]), f"{prefix}{key}")
            elif name in _sections(section):  # a section (not also a field) given one value
                fields = ", ".join(f.name for f in dataclasses.fields(_sections(section)[name])[:3])
                raise UserError(
                    f"--config {path}: {prefix}{key}: {json.dumps(value, ensure_ascii=False)}: {key} is a section, "
                    f"not a field: give its fields ({fields}, ...) under it or at the top level"
                )
            else:
                raise UserError(
                    f"--config {path}: {key!r} is not a field of `bertgpu {command}`"
                    + _nearest_key(str(key), value, names, negated, command)
                )

    add(data, cls, "")
    return flat


def _negated_flags(names: dict[str, tuple[Any, dataclasses.Field]]) -> dict[str, str]:
    """The keys that name a field by its negated flag (``--no-nsp``, ``--no-fused-qkv``; ``--no-cased`` of an
    optional bool's pair of flags), spelled with ``_``: key -> field."""
    negated = {}
    for name, (t, f) in names.items():
        flag = f.metadata.get("flag", "")
        if flag.startswith("--no-"):
            negated[flag[2:].replace("-", "_")] = name
        elif _unwrap_optional(t) == (bool, True):
            negated[f"no_{name}"] = name
    return negated


def _nearest_key(
    key: str, value: Any, names: dict[str, tuple[Any, dataclasses.Field]], negated: typing.Collection[str], command: str
) -> str:
    """The hint of an unknown key: the nearest field or flag name (spelled as the file spells keys), ``X: false``
    for ``no-X: true`` where X is a true-or-false field without a --no- flag, else where the names are listed."""
    dash = "-" in key
    spelled = {(n.replace("_", "-") if dash else n): n for n in [*names, *negated]}
    base = key.replace("-", "_")
    if base.startswith("no_") and _unwrap_optional(names.get(base[3:], (None,))[0])[0] is bool:
        return f" (did you mean {key[3:]}: {'true' if value is False else 'false'}?)"
    near = nearest(key, spelled) or difflib.get_close_matches(key, spelled, n=1, cutoff=0.5)
    if near:
        return f" (did you mean {' or '.join(near)}?)"
    return f" (see bertgpu {command} --help)"


# Fields that exclude each other: one typed on the command line overrides the --config file's value of the other
# too, as it overrides the file's own (a checkpoint's bertgpu.json holds the --steps its --time-budget planned).
EXCLUSIVE = (("steps", "time_budget"),)


def _yield_to_typed(values: dict[str, Any], typed: typing.Collection[str]) -> dict[str, Any]:
    """The --config file's ``values`` less those that exclude a field typed on the command line (``EXCLUSIVE``),
    taken from the file's own list of the fields its run was given too."""
    dropped = {b for pair in EXCLUSIVE for a, b in (pair, pair[::-1]) if a in typed and b not in typed}
    values = {k: v for k, v in values.items() if k not in dropped}
    if isinstance(values.get("given"), list):
        values["given"] = [name for name in values["given"] if name not in dropped]
    return values


def _apply_config_file(parser: argparse.ArgumentParser, values: dict[str, Any]) -> None:
    """Make the file's values the defaults of the command's flags, so that flags given override them."""
    for action in parser._actions:
        if action.dest in values:
            value = values[action.dest]
            if not action.option_strings and action.nargs in ("+", None):  # a positional the file provides
                action.nargs = "*" if action.nargs == "+" else "?"
            action.required = False
            action.default = value


def build_config(cls: type, ns: argparse.Namespace, given: typing.Collection[str] = ()) -> Any:
    """The command's config from its parsed flags; ``given``: the fields the user set (flags or the --config
    file), for a config that keeps them (``PretrainConfig.given``)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            kwargs[f.name] = build_config(t, ns)
        elif f.metadata.get("internal"):
            kwargs[f.name] = sorted(given)
        elif hasattr(ns, f.name):  # else a field the command leaves out: its default
            kwargs[f.name] = getattr(ns, f.name)
    return cls(**kwargs)


def given_fields(parser: argparse.ArgumentParser, argv: list[str], from_file: typing.Collection[str]) -> set[str]:
    """The fields the user set: each flag typed in ``argv`` (--flag VALUE or --flag=VALUE), by its destination,
    and each field of the --config file (``from_file``)."""
    dest = {option: a.dest for a in parser._actions for option in a.option_strings}
    return {dest[arg.split("=", 1)[0]] for arg in argv if arg.split("=", 1)[0] in dest} | set(from_file)


def _blame_the_file(
    message: str, path: str, parser: argparse.ArgumentParser, argv: list[str], from_file: dict[str, Any]
) -> str:
    """An error that begins with a flag (``--steps must be at least 1``) whose value came from the --config
    file, not typed: the file and its key, as a type error there names them (the user never typed --steps)."""
    flag = message.split(" ", 1)[0].rstrip(":,")
    dest = {option: a.dest for a in parser._actions for option in a.option_strings}.get(flag)
    if dest is None or dest not in from_file or dest in given_fields(parser, argv, ()):
        return message
    return f"--config {path}: {dest}{message[len(flag) :]}"


def _vocab(cfg: VocabConfig) -> None:
    from bertgpu.data.tokenizer import coverage, train_vocab

    path = train_vocab(
        cfg.corpus, cfg.size, cfg.out, cased=cfg.cased, text_field=cfg.text_field, overwrite=cfg.overwrite
    )
    unknown, total = coverage(path, cfg.corpus, cfg.cased, cfg.text_field)
    entries = sum(1 for _ in open(path, encoding="utf-8"))
    print(
        f"vocab: {path} ({entries:,} entries); it spells {1 - unknown / max(total, 1):.2%} of the corpus's "
        f"tokens ({unknown:,} [UNK] of {total:,} in its first lines)"
    )


def _prepare(cfg: PrepareConfig) -> None:
    from bertgpu.data.shard_writer import check_prepare, prepare
    from bertgpu.data.tokenizer import vocab_is_cased

    cfg = check_prepare(cfg)
    cased = vocab_is_cased(cfg.vocab) if cfg.cased is None else cfg.cased
    prepare(
        cfg.corpus,
        cfg.vocab,
        cfg.out,
        workers=cfg.workers,
        lowercase=not cased,
        overwrite=cfg.overwrite,
        strict=cfg.strict,
        text_field=cfg.text_field,
        split_sentences=cfg.split_sentences,
        zh_wwm=cfg.zh_wwm,
        max_unk_share=cfg.max_unk_share,
    )


def _pretrain(cfg: PretrainConfig) -> None:
    from bertgpu.tasks import pretrain

    pretrain.run(cfg)


def _inspect(cfg: InspectConfig) -> None:
    from bertgpu.data import inspect

    inspect.run(cfg)


def _finetune(cfg: FinetuneConfig) -> None:
    from bertgpu.tasks import finetune

    finetune.run_finetune(cfg)


def _evaluate(cfg: EvaluateConfig) -> None:
    from bertgpu.tasks import evaluate_mlm, predict

    if evaluate_mlm.is_prepared(cfg.data):  # pretraining data: masked-LM metrics of any BERT
        evaluate_mlm.run(cfg)
    else:
        predict.run_evaluate(cfg)


def _predict(cfg: PredictConfig) -> None:
    from bertgpu.tasks import predict

    predict.run_predict(cfg)


def _fill_mask(cfg: FillMaskConfig) -> None:
    from bertgpu.tasks import fill_mask

    fill_mask.run(cfg)


def _bench(cfg: BenchConfig) -> None:
    from bertgpu.tasks.bench import run

    run(cfg)


COMMANDS: dict[str, tuple[type, Callable[[Any], None], str]] = {
    "vocab": (VocabConfig, _vocab, "train a BERT WordPiece vocab on a corpus"),
    "prepare": (PrepareConfig, _prepare, "tokenize a corpus into memory-mapped pretraining shards"),
    "pretrain": (PretrainConfig, _pretrain, "pretrain BERT (masked LM + next-sentence prediction)"),
    "inspect": (InspectConfig, _inspect, "print pretraining instances of prepared data as pretrain builds them"),
    "finetune": (FinetuneConfig, _finetune, "fine-tune a BERT into a text classifier"),
    "evaluate": (
        EvaluateConfig,
        _evaluate,
        "loss, accuracy and F1 of a classifier on labelled data, or masked-LM "
        "metrics of a pretrained BERT on prepared data",
    ),
    "predict": (PredictConfig, _predict, "classify a text, a text pair, or every row of a file"),
    "fill-mask": (
        FillMaskConfig,
        _fill_mask,
        "the most likely tokens for each [MASK] of a text (a quick check of a pretrained model)",
    ),
    "bench": (BenchConfig, _bench, "time pretraining steps of bertgpu and of transformers, same model and batch"),
}


class Parser(argparse.ArgumentParser):
    """argparse's parser with every mistake in one line (naming the flag, and the nearest one for a typo)
    instead of the command's whole usage, which --help prints; flags are typed whole (no abbreviations:
    --epoch is not taken for --epochs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # A typo's suggestion is enough; else where the command's flags are listed.
        hint = "" if "did you mean" in message else f" (see `{self.prog} --help`)"
        self.exit(2, f"bertgpu: error: {message}{hint}\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r}{did_you_mean(str(value), choices)}; choose from {', '.join(choices)}",
            )
        super()._check_value(action, value)


def _flag_like(arg: str, parser: argparse.ArgumentParser) -> bool:
    """Whether argparse takes ``arg`` for a flag: it starts with '-', is not a negative number, '-' (standard
    input) or a text with a space."""
    return arg.startswith("-") and arg != "-" and " " not in arg and not parser._negative_number_matcher.match(arg)


def check_flags(parser: argparse.ArgumentParser, args: list[str]) -> None:
    """A flag the command does not have is an error naming the nearest ones, before argparse's own parse
    (which would first complain of a required flag missing, the one the typo meant)."""
    options = [option for action in parser._actions for option in action.option_strings]
    for arg in args:
        if arg == "--":  # what follows is positional
            return
        name = arg.split("=", 1)[0]
        if _flag_like(arg, parser) and name not in options:
            parser.error(f"`{parser.prog}` has no flag {name}{did_you_mean(name, options)}")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="bertgpu",
        description="BERT from raw text to a classifier, on one CPU, one GPU, all GPUs of a machine, or many machines.",
    )
    parser.add_argument("--version", action="version", version=f"bertgpu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (cls, _, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=(cls.__doc__ or "").strip())
        p.add_argument(
            "--config",
            metavar="FILE",
            help="a JSON or YAML file of this command's fields (the flags' "
            "names, flat or in sections), or a checkpoint's bertgpu.json to re-run its run; flags "
            "given override it",
        )
        add_config_arguments(p, cls)
    return parser


_config_only = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
_config_only.add_argument("--config")


def main(argv: list[str] | None = None) -> None:
    warnings.formatwarning = lambda message, *args, **kwargs: f"bertgpu: warning: {message}\n"
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in commands:
        check_flags(commands[argv[0]], argv[1:])
    from_file: dict[str, Any] = {}
    try:
        if argv and argv[0] in commands and "--config" in " ".join(argv):
            # The file's values become the defaults before the real parse, so required flags may come from it.
            known, _ = _config_only.parse_known_args(argv[1:])
            if known.config:
                from_file = read_config_file(known.config, argv[0], COMMANDS[argv[0]][0])
                from_file = _yield_to_typed(from_file, given_fields(commands[argv[0]], argv[1:], ()))
                _apply_config_file(commands[argv[0]], from_file)
    except UserError as e:
        print(f"bertgpu: error: {e}", file=sys.stderr)
        sys.exit(2)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would blame the top-level parser, not the command
        commands[args.command].error(f"unexpected argument(s): {' '.join(unknown)}")
    cls, fn, _ = COMMANDS[args.command]
    try:
        # A checkpoint's bertgpu.json holds every field: what its run was given is its own list of them.
        file_given = from_file["given"] if isinstance(from_file.get("given"), list) else from_file
        cfg = build_config(cls, args, given_fields(commands[args.command], argv[1:], file_given))
        if getattr(args, "config", None):  # the file is an input too (each command checks its own inputs)
            # the command's outputs, as its parsed flags name them (a command has --out, --output or neither)
            outputs = {flag: vars(args).get(name, "") for name, flag in (("out", "--out"), ("output", "--output"))}
            refuse_clobbering(outputs, {"--config": args.config})
        fn(cfg)
    except UserError as e:
        message = str(e)
        if from_file:
            message = _blame_the_file(message, args.config, commands[args.command], argv[1:], from_file)
        print(f"bertgpu: error: {message}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("bertgpu: interrupted", file=sys.stderr)
        sys.exit(130)
