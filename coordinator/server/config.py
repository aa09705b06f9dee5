"""Configuration of one ``fencingd serve`` process: a TOML file plus command-line overrides.

Owns: building a ``ServerConfig`` (settings.py declares every setting, with its unit) from
TOML (``tomllib``) and ``--flag`` overrides: one flag per setting, each value coerced to its
setting's type, unknown keys or bad values refused with a message that names the key, the
result checked (config_checks.py). The rest of the server takes ``ServerConfig``,
``ConfigError``, ``build``, ``from_args`` and ``add_arguments`` from here.
Must never: start anything, open sockets or touch the data directory.

Example (``fencingd serve --config node1.toml``)::

    data_dir = "/var/lib/fencing/node1"
    raft_address = "10.0.0.1:7000"          # this member's id
    members = ["10.0.0.1:7000=10.0.0.1:7100",   # RAFT_ADDRESS=API_ADDRESS, all members
               "10.0.0.2:7000=10.0.0.2:7100",
               "10.0.0.3:7000=10.0.0.3:7100"]
    admin_token_file = "/etc/fencing/admin-token"
    raft_secret_file = "/etc/fencing/raft-secret"   # fencingd gen-secret; the same on every member
    initial_cluster_state = "new"   # an initial member of a new cluster; default "existing"

Every key can be given as a flag instead: ``--raft-address``, ``--members A=B,C=D``,
``--inflight-proposals-max 64`` ... Flags win over the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from coordinator.server import tomlfile
from coordinator.server.config_checks import validate
from coordinator.server.settings import ConfigError, ServerConfig

# Setting name -> its dataclass field: type, default and doc line.
_FIELDS = {f.name: f for f in dataclasses.fields(ServerConfig)}


def _coerce(name: str, value: Any) -> Any:
    """``value`` as the type of field ``name``; raises ConfigError naming the key."""
    kind = _FIELDS[name].type
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{name}: must be a string, got {type(value).__name__}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: must be an integer, got {type(value).__name__}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: must be a number, got {type(value).__name__}")
        return float(value)
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: must be true or false, got {type(value).__name__}")
        return value
    if kind == "tuple[str, ...]":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name}: must be a list of strings")
        return tuple(value)
    raise AssertionError(f"unhandled config type {kind} for {name}")


def read_toml(path: str) -> dict[str, Any]:
    raw = tomlfile.load(path, "config file", ConfigError)
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown key(s) {', '.join(unknown)}")
    return raw


def build(file_values: dict[str, Any], overrides: dict[str, Any], *, read_files: bool = True) -> ServerConfig:
    """A validated config: defaults, then ``file_values``, then ``overrides`` (None = not given)."""
    values: dict[str, Any] = {}
    for source in (file_values, overrides):
        for key, value in source.items():
            if key not in _FIELDS:
                raise ConfigError(f"unknown key {key}")
            if value is not None:
                values[key] = _coerce(key, value)
    if "data_dir" in values:
        values["data_dir"] = os.path.abspath(os.path.expanduser(values["data_dir"]))
    return validate(ServerConfig(**values), read_files=read_files)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per config key; each defaults to None (not given)."""
    parser.add_argument("--config", metavar="FILE", help="TOML file with the keys below")
    for name, f in _FIELDS.items():
        flag = "--" + name.replace("_", "-")
        kind = {"int": int, "float": float}.get(str(f.type), str)  # the annotation, a string here
        default = "" if f.default in ("", ()) or f.type == "bool" else f" (default {f.default})"
        parser.add_argument(flag, dest=name, type=kind, default=None, help=f.metadata["doc"] + default)


def from_args(args: argparse.Namespace, *, read_files: bool = True) -> ServerConfig:
    file_values = read_toml(args.config) if args.config else {}
    return build(file_values, {name: getattr(args, name) for name in _FIELDS}, read_files=read_files)
