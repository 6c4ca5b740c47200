"""One versioned configuration file for the programs, mapped onto their flags.

```yaml
apiVersion: gpushare.io/v1
kind: Configuration
scheduler:            # share-scheduler
  policy: frag
  filterKeeps: best
plugin:               # share-plugin
  deviceListStrategy: envvar
  monitorInterval: 10
dra:                  # share-dra
  unhealthy: withdraw
```

Each section's fields are its program's long flags in camelCase (`--filter-keeps` is `filterKeeps`), with
the flag's type: a switch takes true/false, a number a number, a choice one of its choices. Why the flags
are the schema: one definition per setting, so the file, the flags and `--help` never disagree, and a new
flag is configurable the day it lands. Precedence: a flag on the command line, then the file, then the
environment variables some flags read, then the built-in default. An unknown section or field, a wrong
type, a bad choice or another apiVersion is refused with an error naming the field: a typo must not
silently run the default.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

API_GROUP = "gpushare.io"
API_VERSIONS = ("gpushare.io/v1",)
KIND = "Configuration"
# Program -> its section; every section the file may hold (a program reads only its own).
SECTIONS = {"share-scheduler": "scheduler", "share-plugin": "plugin", "share-dra": "dra", "share-webhook": "webhook"}
CONFIG_FLAG = "--config"
# Flags that make no sense in a file: the file itself, and help.
NOT_CONFIGURABLE = frozenset({"help", "config"})
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ConfigError(ValueError):
    """The configuration file is unusable; the message names the file and the field."""


def field_name(option: str) -> str:
    """`--filter-keeps` -> `filterKeeps`."""
    head, *rest = option.lstrip("-").split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def start_logging(level: str) -> None:
    """The programs' one log format, on stderr, at their `--log-level` (any case)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)


def add_config_arg(parser: argparse.ArgumentParser) -> None:
    section = SECTIONS.get(parser.prog, "<program>")
    parser.add_argument(
        CONFIG_FLAG,
        metavar="FILE",
        help=f"a {API_VERSIONS[-1]} {KIND} file (YAML); this program reads its `{section}` section. "
        "Flags given here win over the file",
    )


def read_config(path: str | Path) -> dict[str, Any]:
    """The file's document, its apiVersion, kind and sections checked; fields are checked per program."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the configuration must be a mapping, not {type(doc).__name__}")
    version = doc.get("apiVersion")
    if version not in API_VERSIONS:
        raise ConfigError(f"{path}: apiVersion: {version!r} is not supported (supported: {', '.join(API_VERSIONS)})")
    if doc.get("kind") != KIND:
        raise ConfigError(f"{path}: kind: {doc.get('kind')!r} must be {KIND!r}")
    for key, value in doc.items():
        if key in ("apiVersion", "kind"):
            continue
        if key not in SECTIONS.values():
            known = ", ".join(["apiVersion", "kind", *SECTIONS.values()])
            raise ConfigError(f"{path}: {key}: unknown field (known: {known})")
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"{path}: {key}: must be a mapping of settings, not {type(value).__name__}")
    return doc


def configurable(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """field name -> the flag's action, for every long flag the file may set."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:  # argparse has no public accessor for its actions
        if action.dest in NOT_CONFIGURABLE or isinstance(action, argparse._HelpAction):
            continue
        longs = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        if longs:
            out[field_name(longs[0])] = action
    return out


def _is_switch(action: argparse.Action) -> bool:
    return isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction | argparse.BooleanOptionalAction)


def convert(where: str, action: argparse.Action, value: Any) -> Any:
    """`value` from the file as the flag's parsed value; ConfigError naming `where` if it is not one."""
    if _is_switch(action):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {value!r} is not a boolean (true or false)")
        if isinstance(action, argparse._StoreFalseAction):
            return not value
        return value
    if isinstance(action, argparse._AppendAction):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: must be a list")
        return [convert(f"{where}[{i}]", _scalar(action), v) for i, v in enumerate(value)]
    if value is None:
        return None
    if isinstance(value, bool) and action.choices is not None:
        # YAML reads an unquoted on/off/yes/no as a boolean: say so, the choices may be just those words.
        choices = ", ".join(map(str, action.choices))
        raise ConfigError(
            f"{where}: {value!r} is not one of {choices} (YAML reads an unquoted on or off as a boolean: quote it)"
        )
    if isinstance(value, bool | dict | list):
        raise ConfigError(f"{where}: {value!r} is not a {_kind(action)}")
    kind = action.type
    if kind is int:
        if not isinstance(value, int):
            raise ConfigError(f"{where}: {value!r} is not a whole number")
        parsed: Any = value
    elif kind is float:
        if not isinstance(value, int | float):
            raise ConfigError(f"{where}: {value!r} is not a number")
        parsed = float(value)
    elif kind is None:
        if not isinstance(value, str | int | float):
            raise ConfigError(f"{where}: {value!r} is not a string")
        parsed = str(value)
    else:
        # A flag with its own parser (a size, a duration): checked here, and handed to argparse as the
        # text it would have read on the command line (argparse runs `type` over string defaults).
        parsed = str(value)
        try:
            checked = kind(parsed)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            raise ConfigError(f"{where}: {value!r}: {exc}") from exc
        if action.choices is not None and checked not in action.choices:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}")
        return parsed
    if action.choices is not None and parsed not in action.choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return parsed


def _scalar(action: argparse.Action) -> argparse.Action:
    return argparse.Action(option_strings=[], dest=action.dest, type=action.type, choices=action.choices)


def _kind(action: argparse.Action) -> str:
    if action.type is int:
        return "whole number"
    if action.type is float:
        return "number"
    return "string"


def section_defaults(parser: argparse.ArgumentParser, doc: Mapping[str, Any], path: str | Path) -> dict[str, Any]:
    """The parser's defaults that this program's section of `doc` sets (dest -> value)."""
    section = SECTIONS.get(parser.prog)
    if section is None:
        raise ConfigError(f"{parser.prog} has no section in a {KIND} file")
    fields = doc.get(section) or {}
    actions = configurable(parser)
    out: dict[str, Any] = {}
    for name, value in fields.items():
        action = actions.get(name)
        if action is None:
            raise ConfigError(f"{path}: {section}.{name}: unknown field (known: {', '.join(sorted(actions))})")
        out[action.dest] = convert(f"{path}: {section}.{name}", action, value)
    return out


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`parser.parse_args(argv)` with `--config FILE` applied beneath the flags given; a bad file exits
    with status 2 and the field named, as a bad flag does."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument(CONFIG_FLAG)
    known, _ = pre.parse_known_args(argv)
    if known.config:
        try:
            defaults = section_defaults(parser, read_config(known.config), known.config)
        except ConfigError as exc:
            parser.error(str(exc))
        parser.set_defaults(**defaults)
    return parser.parse_args(argv)
