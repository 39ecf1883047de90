"""Daemon configuration: flags, a TOML file and ``TENSORWIRE_*`` environment variables.

Precedence, lowest to highest: the flag's default, the TOML file (``--config``, keys named like the
flags, ``-`` or ``_``, optionally under a ``[ps]`` or ``[worker]`` table), the environment
(``TENSORWIRE_STEPS=100`` for ``--steps``), explicit flags. Every value goes through the flag's own
type conversion and choices, so a bad value says which flag, file or variable it came from.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import urlsplit

import tensorwire as tw

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENV_PREFIX = "TENSORWIRE_"


def is_loopback(endpoint: str) -> bool:
    """Does ``tcp://HOST:PORT`` listen only on this machine?"""
    host = urlsplit(endpoint).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def add_secret_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--secret", default=None, help="shared secret (prefer --secret-file or TENSORWIRE_SECRET)"
    )
    parser.add_argument(
        "--secret-file", default=None, metavar="PATH", help="read the shared secret from this file"
    )


def add_nixl_flags(parser: argparse.ArgumentParser) -> None:
    """NIXL and UCX settings for ``--transport nixl`` (tensorwire.NixlOptions), so that nobody
    has to export UCX_* variables by hand."""
    group = parser.add_argument_group("nixl (with --transport nixl)")
    group.add_argument(
        "--nixl-progress-thread",
        action="store_true",
        help="run NIXL's own progress thread (off: it keeps a core busy, which costs throughput "
        "on small machines)",
    )
    group.add_argument(
        "--ucx-net-devices",
        default=None,
        metavar="DEVS",
        help="UCX_NET_DEVICES, e.g. mlx5_0:1 (default: lo on a loopback --bind, else UCX's choice)",
    )
    group.add_argument(
        "--ucx-tls",
        default=None,
        metavar="LIST",
        help="UCX_TLS, the UCX transports allowed, e.g. rc,cma,tcp (default: UCX's choice)",
    )


def nixl_options(args: argparse.Namespace) -> tw.NixlOptions | None:
    """The NIXL settings of a daemon (None unless it runs ``--transport nixl``)."""
    if args.transport != "nixl":
        return None
    return tw.NixlOptions(
        progress_thread=args.nixl_progress_thread,
        net_devices=args.ucx_net_devices,
        tls=args.ucx_tls,
    )


def resolve_secret(
    parser: argparse.ArgumentParser, args: argparse.Namespace, bind: str
) -> str | None:
    """The shared secret from --secret, --secret-file or TENSORWIRE_SECRET; required (the daemon
    refuses to start) when ``bind`` accepts connections from other hosts."""
    secret = args.secret
    if args.secret_file:
        try:
            with open(args.secret_file) as f:
                secret = f.read().strip()
        except OSError as exc:
            parser.error(f"cannot read --secret-file {args.secret_file}: {exc.strerror}")
        if not secret:
            parser.error(f"--secret-file {args.secret_file} is empty")
    if not secret and not is_loopback(bind):
        parser.error(
            f"--bind {bind} accepts connections from other hosts, so a shared secret is "
            "required: pass --secret-file PATH or set TENSORWIRE_SECRET (the same on every "
            "server and worker)"
        )
    return secret or None


def _convert(
    parser: argparse.ArgumentParser, action: argparse.Action, value: Any, source: str
) -> Any:
    flag = action.option_strings[-1] if action.option_strings else action.dest
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if isinstance(value, str):
            low = value.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                parser.error(f"{source}: {flag} must be true or false, not {value!r}")
            value = low in ("1", "true", "yes", "on")
        if not isinstance(value, bool):
            parser.error(f"{source}: {flag} must be true or false, not {value!r}")
        return value
    convert: Any = action.type
    if convert is not None and isinstance(value, str):
        try:
            value = convert(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            parser.error(f"{source}: {flag}: invalid value {value!r} ({exc})")
    elif convert is not None and not isinstance(value, (str, list, dict)):
        try:
            value = convert(value)
        except (TypeError, ValueError) as exc:
            parser.error(f"{source}: {flag}: invalid value {value!r} ({exc})")
    if action.choices is not None and value not in action.choices:
        parser.error(
            f"{source}: {flag} must be one of {', '.join(map(str, action.choices))}, not {value!r}"
        )
    return value


def parse(
    parser: argparse.ArgumentParser, argv: list[str] | None, section: str
) -> argparse.Namespace:
    """Parse ``argv`` merging defaults < TOML file < environment < flags (see module doc)."""
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "version", "config")}
    defaults = {dest: a.default for dest, a in actions.items()}
    for a in actions.values():
        a.default = argparse.SUPPRESS
    given = vars(parser.parse_args(argv))
    values = dict(defaults)
    path = given.pop("config", None)
    if path:
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except OSError as exc:
            parser.error(f"cannot read config file {path}: {exc.strerror}")
        except tomllib.TOMLDecodeError as exc:
            parser.error(f"config file {path} is not valid TOML: {exc}")
        if isinstance(table.get(section), dict):
            table = table[section]
        for key, value in table.items():
            if isinstance(value, dict):
                continue  # another daemon's table
            dest = key.replace("-", "_")
            if dest not in actions:
                parser.error(f"config file {path}: unknown key {key!r}")
            values[dest] = _convert(parser, actions[dest], value, f"config file {path}")
    for dest, action in actions.items():
        env = ENV_PREFIX + dest.upper()
        if env in os.environ:
            values[dest] = _convert(parser, action, os.environ[env], f"environment {env}")
    values.update(given)
    return argparse.Namespace(**values)
