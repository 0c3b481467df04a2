"""Errors a user can fix, reported as one line instead of a traceback.

An *expected* error is a mistake in what the user gave (a path, a row, a value, a name, a
checkpoint) or in the machine's state (a full disk, a read-only folder). Every command reports it
as ``error: <message>`` on stderr and exits with status 2; ``--debug`` (or ``MGSR_DEBUG=1``) shows
the traceback instead. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

DEBUG_FLAG = "--debug"
DEBUG_ENV = "MGSR_DEBUG"
EXIT_CODE = 2
# OSErrors that come from the machine's state rather than from a bug
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}


class UserError(Exception):
    """A mistake in the input or the environment, explained in the message."""


class ConfigError(UserError, ValueError):
    """A value of the configuration or of a command's options that cannot work."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist."""


class LoadError(UserError, OSError):
    """A model or tokenizer that cannot be loaded from what was named."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that is missing, truncated or not one of ours."""


class NonFiniteLossError(UserError, FloatingPointError):
    """The training loss became NaN or infinite."""


def debug_requested(argv: list[str]) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def user_message(error: BaseException) -> str | None:
    """The one-line message of an expected error, None for anything else (a bug)."""
    if isinstance(error, UserError):
        message = str(error)
    elif isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS:
        where = f" {error.filename}" if error.filename else ""
        message = f"cannot write{where}: {error.strerror or error}"
    else:
        return None
    return " ".join(message.split())  # one line, whatever the message's own layout


def exit_with(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_CODE)


def report(error: BaseException, debug: bool) -> None:
    """Exit with one line for an expected error (unless ``debug``); return for anything else."""
    message = user_message(error)
    if message is not None and not debug:
        exit_with(f"{message} (run with {DEBUG_FLAG} for the traceback)")


def _class_options(class_path: str) -> tuple[list[str], bool]:
    """Option names of a class or dataclass named by its import path, and whether it is a dataclass."""
    import dataclasses
    import importlib
    import inspect

    module_name, _, name = class_path.rpartition(".")
    try:
        target = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return [], False
    if dataclasses.is_dataclass(target):
        return [f.name for f in dataclasses.fields(target)], True
    parameters = inspect.signature(target.__init__).parameters.values()
    return [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)], False


def _group_options(class_path: str, group: str) -> tuple[list[str], str]:
    """Field names of the dataclass that option ``group`` (dotted, e.g. ``optimizer`` or ``distill.params``) of a
    class takes, and its name; ([], "") when it is not a dataclass."""
    import dataclasses
    import importlib
    import typing

    module_name, _, name = class_path.rpartition(".")
    try:
        target: Any = getattr(importlib.import_module(module_name), name)
        hints = typing.get_type_hints(target.__init__)
    except Exception:  # noqa: BLE001 - a class we cannot inspect gives no options
        return [], ""
    for part in group.split("."):
        hint = hints.get(part)
        candidates = [hint, *typing.get_args(hint)]
        target = next((c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None)
        if target is None:
            return [], ""
        hints = typing.get_type_hints(target)
    return [f.name for f in dataclasses.fields(target)], target.__name__


def _options_line(key: str, options: list[str], what: str) -> str:
    import difflib

    name = key.rpartition(".")[2]
    close = difflib.get_close_matches(name, options, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown option {key!r}; {hint}valid options of {what}: {', '.join(options)}"


def _type_name(text: str) -> str:
    text = text.replace("typing.", "")
    class_match = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", text)
    if class_match:
        return class_match.group(1)
    literal = re.fullmatch(r"Literal\[(.*)\]", text)
    return f"one of {literal.group(1)}" if literal else text


def _unknown_parser_key(key: str, options_under: Callable[[str], list[str]]) -> str:
    """The first component of ``key`` the parser does not know, with the options known at that level."""
    parts = key.split(".")
    depth = 0
    while depth < len(parts) - 1 and parts[depth] in options_under(".".join(parts[:depth])):
        depth += 1
    parent = ".".join(parts[:depth])
    return _options_line(".".join(parts[: depth + 1]), options_under(parent), parent or "the command")


def condense_parser_error(message: str, options_under: Callable[[str], list[str]]) -> str:
    """One line from a jsonargparse error: the bad key with what was expected, or the valid options.

    ``options_under(prefix)`` lists the parser's own option names below ``prefix`` ("" = top level).
    Nested errors (an option of the model's class, a field of one of its dataclasses) are followed
    down to the innermost one, and the full dotted key is rebuilt on the way.
    """
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    first = lines[0] if lines else message
    unrecognized = re.match(r"unrecognized arguments: (.*)", first)
    if unrecognized:
        tokens = unrecognized.group(1).split()
        flags = [t for t in tokens if t.startswith("--")]
        if not flags:
            return f"unexpected {' '.join(tokens)!r} (a subcommand is given once, first; options start with --)"
        return _unknown_parser_key(flags[0][2:].split("=", 1)[0], options_under)
    if first.startswith("Problems parsing config"):  # YAML syntax: keep the reason and its line
        where = re.search(r"line (\d+), column (\d+)", message)
        reason = " ".join(line for line in lines[1:] if not line.startswith(("in ", "^")))
        location = f" (line {where.group(1)}, column {where.group(2)})" if where else ""
        return f"config is not valid YAML{location}: {reason or first}"
    subcommand_option = re.search(r"does not accept option '([^']+)'", first)
    if subcommand_option:
        return _unknown_parser_key(subcommand_option.group(1), options_under)
    required = re.match(r"the following arguments are required: (.*)", first)
    if required:
        return "missing required options: " + ", ".join(f"--{name.strip()}" for name in required.group(1).split(","))
    missing_file = re.search(r'Parser key "([^"]+)": File does not exist: (.*)', " ".join(lines))
    if missing_file:
        return f"{missing_file.group(1)} file not found: {missing_file.group(2).strip(chr(39))}"

    path: list[str] = []
    last_class: str | None = None
    union: str | None = None
    for line in lines:
        key = re.match(r'Parser key "([^"]+)":\s*(.*)', line)
        if key:
            path.append(key.group(1))
            rest = key.group(2)
            expected = re.match(r"Expected a (.+)\. Got value: (.*)", rest)
            if expected and expected.group(2) == "None":
                return f"{'.'.join(path)} is required"
            if expected:
                return f"{'.'.join(path)}: expected {_type_name(expected.group(1))}, got {expected.group(2)!r}"
            if rest:
                return f"{'.'.join(path)}: {rest}"
            continue
        problem = re.search(r"Problem with given class_path '([^']+)'", line)
        if problem:
            last_class = problem.group(1)
            options, is_dataclass = _class_options(last_class)
            if not is_dataclass:
                path.append("init_args")
            continue
        group_option = re.search(r"Group '([^']+)' does not accept option '([^']+)'", line)
        if group_option and last_class is not None:  # a misspelt key inside a dataclass option (from a config file)
            key = ".".join(path + [group_option.group(1), group_option.group(2)])
            options, what = _group_options(last_class, group_option.group(1))
            if options:
                return _options_line(key, options, what)
            return f"unknown option {key!r}"
        not_accepted = re.search(r"Option '([^']+)' is not accepted|Key '([^']+)' is not expected", line)
        if not_accepted:
            name = not_accepted.group(1) or not_accepted.group(2)
            key = ".".join(path + [name])
            if last_class is None:
                return _unknown_parser_key(key, options_under)
            options, _ = _class_options(last_class) if last_class else ([], False)
            return _options_line(key, options, last_class.rpartition(".")[2] if last_class else ".".join(path))
        subtypes = re.match(r"Subtypes: \[(.*)\]", line)
        if subtypes and path:  # a union (e.g. `dict | None`): say which types it takes
            names = [_type_name(t) for t in re.split(r", (?![^\[]*\])", subtypes.group(1))]
            union = " or ".join("null" if name == "NoneType" else name for name in names)
            continue
        given = re.match(r"Given value: (.*)", line)
        if given and path and union:
            key = ".".join(path)
            hint = ""
            if given.group(1) == "None":  # jsonargparse reads a nested `--a.b=null` as the string "None"
                parent, _, leaf = key.rpartition(".")
                hint = ("; to unset it from the command line, give its parent one JSON value: "
                        f"--{parent}='{{\"{leaf}\": null, ...}}'")
            return f"{key}: expected {union}, got {given.group(1)!r}{hint}"
        expected = re.match(r"(?:- )?Expected a (.+)\. Got value: (.*)", line)
        if expected and expected.group(2) == "None" and path:
            return f"{'.'.join(path)} is required"
        if expected and "NoneType" not in expected.group(1):
            return f"{'.'.join(path)}: expected {_type_name(expected.group(1))}, got {expected.group(2)!r}"
    return " ".join(first.split())
