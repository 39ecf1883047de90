"""Daemon configuration: flags, a TOML file and ``TENSORWIRE_*`` environment variables.

Built on `ConfigArgParse <https://github.com/bw2/ConfigArgParse>`_. Precedence, lowest to highest:
the flag's default, the TOML file (``--config``, keys named like the flags, under a ``[ps]`` or
``[worker]`` table), the environment (``TENSORWIRE_STEPS=100`` for ``--steps``), explicit flags.
Every value goes through the flag's own type conversion and choices, and a bad one says which
flag, and which file or variable it came from; ``--help`` shows each setting's variable.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any, NoReturn
from urllib.parse import urlsplit

import configargparse

import tensorwire as tw
from tensorwire import metrics as tw_metrics
from tensorwire.endpoint import (
    ipv6_hint,
    is_loopback_host,
    socket_host,
    split_endpoint,
    unresolvable_host,
)
from tensorwire.job import files

# the daemons' parsers use these as config.<name>
from tensorwire.job.argtypes import amount as amount
from tensorwire.job.argtypes import at_least as at_least
from tensorwire.job.argtypes import below_one as below_one
from tensorwire.job.argtypes import fraction as fraction
from tensorwire.job.argtypes import path as path
from tensorwire.job.argtypes import positive_number as positive_number
from tensorwire.job.argtypes import positive_seconds as positive_seconds
from tensorwire.job.argtypes import seconds_or_forever as seconds_or_forever
from tensorwire.job.argtypes import zero_or_more_seconds as zero_or_more_seconds
from tensorwire.metrics import Metric, MetricsServer

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENV_PREFIX = "TENSORWIRE_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


class _TomlTable(configargparse.TomlConfigParser):
    """ConfigArgParse's TOML reader for one daemon's table, which also refuses settings left
    outside any table (they would otherwise be ignored without a word)."""

    def __init__(self, section: str) -> None:
        super().__init__([section])
        self.section = section
        #: the file read last: ConfigArgParse refuses a list given a flag of one value before
        #: it records where the list came from (DaemonParser.error names it from here)
        self.path: str | None = None

    def parse(self, stream: Any) -> Any:
        self.path = getattr(stream, "name", None)
        text = stream.read()
        try:
            table = tomllib.loads(text.decode() if isinstance(text, bytes) else text)
        except tomllib.TOMLDecodeError as exc:
            raise configargparse.ConfigFileParserException(f"not valid TOML: {exc}") from None
        loose = [k for k, v in table.items() if not isinstance(v, dict)]
        if loose:
            raise configargparse.ConfigFileParserException(
                f"settings must be under a [{self.section}] table, found {', '.join(loose)} "
                "outside it"
            )
        if self.section not in table:
            # a file written for another daemon (or its table misspelt): none of it would apply
            tables = ", ".join(f"[{k}]" for k in table) or "none"
            raise configargparse.ConfigFileParserException(
                f"no [{self.section}] table: this daemon reads its settings there (the file "
                f"has {tables})"
            )
        # The table's values as ConfigArgParse's TOML reader gives them (lists as lists, the
        # rest as strings that argparse converts), from the table read above: that reader
        # imports tomllib or the toml package itself, and on Python 3.10, which has neither
        # (tomli is what we install there), every --config failed ("Could not import toml").
        # TOML keys are often written with underscores (no_shm): the flag's name either way.
        return {
            key.replace("_", "-"): value if isinstance(value, list) else str(value)
            for key, value in table[self.section].items()
            if value is not None
        }


class DaemonParser(configargparse.ArgParser):
    """An argument parser that reads a TOML file and ``TENSORWIRE_*`` variables too, and whose
    errors name the file or variable a bad value came from."""

    def error(self, message: str) -> NoReturn:
        listed = re.match(r"(\S+) can't be set to a list '(.*)' unless", message)
        if listed:  # ConfigArgParse's words, for a TOML list given a flag of one value
            path = getattr(getattr(self, "_config_file_parser", None), "path", None)
            message = (
                f"argument --{listed[1]}: takes one value, not the list {listed[2]} (in "
                + (f"config file {path}" if path else "the --config file")
                + ")"
            )
        super().error(message + self._source_of(message))
        raise SystemExit(2)  # argparse's error() exits; this line is for the type checker

    def _source_of(self, message: str) -> str:
        for source, settings in self._sources().items():
            where = source.split("|", 1)[1] if source.startswith("config_file|") else ""
            for key, (action, _value) in settings.items():
                if action is None and where and f"--{key}" in message:  # a key no flag has
                    return f" (unknown key {key!r} in config file {where})"
        flag = re.search(r"argument (--[\w-]+)", message)
        given = self.source(flag.group(1)) if flag else None
        return f" (from {given})" if given and given != "the command line" else ""

    def source(self, flag: str) -> str | None:
        """Where the value of ``flag`` (``--secret``) came from, as messages name it: "the
        command line", "environment TENSORWIRE_SECRET" or "config file PATH"; None when it
        was not given (its default)."""
        for source, settings in self._sources().items():
            for key, (action, value) in settings.items():
                if source == "command_line":
                    # argparse takes "--secret S" and "--secret=S", and nothing shorter here
                    # (an abbreviation of --secret is one of --secret-file's too)
                    if any(arg == flag or arg.startswith(f"{flag}=") for arg in value):
                        return "the command line"
                elif action is not None and flag in action.option_strings:
                    if source == "environment_variables":
                        return f"environment {key}"
                    return f"config file {source.split('|', 1)[1]}"
        return None

    def _sources(self) -> dict[str, Any]:
        # ConfigArgParse's record of the last parse: {"command_line": {"": (None, argv)},
        # "environment_variables": {VAR: (action, value)}, "config_file|PATH": {key: ...}}
        return getattr(self, "_source_to_settings", None) or {}


def new_parser(prog: str, description: str, section: str) -> DaemonParser:
    """A daemon's parser: ``--config`` reads the ``[section]`` table of a TOML file, every flag
    has a ``TENSORWIRE_*`` variable, and ``--version`` says which tensorwire this is."""
    parser = DaemonParser(
        prog=prog,
        description=description,
        config_file_parser_class=_TomlTable(section),
        args_for_setting_config_path=["--config"],
        config_arg_help_message=(
            f"read settings from a TOML file: keys named like the flags (join-timeout or "
            f"join_timeout), under [{section}]"
        ),
        auto_env_var_prefix=ENV_PREFIX,
        epilog=(
            f"Every flag may also come from a TOML file (--config; under [{section}], e.g. "
            f"steps = 100) or a {ENV_PREFIX}* variable, named beside each flag above; "
            "precedence: flags, then variables, then the file, then the defaults."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {tw.__version__}")
    return parser


def add_logging_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=LOG_LEVELS,
        help="DEBUG, INFO, WARNING or ERROR, in any case (default INFO)",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        type=str.lower,
        choices=LOG_FORMATS,
        help="text: one readable line per record; json: one JSON object per line (time, level, "
        "daemon, logger, message), for log collectors (default text)",
    )


def setup_logging(level: str, who: str, fmt: str = "text") -> None:
    """Log records with their time, daemon and level on stderr, as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLines(who))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {who} %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


class JsonLines(logging.Formatter):
    """One JSON object per record: what log collectors (Loki, Fluent Bit, CloudWatch) parse."""

    def __init__(self, who: str) -> None:
        super().__init__()
        self.who = who

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "daemon": self.who,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def add_metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics while running (0: a free "
        "port, logged); needs prometheus-client: pip install 'tensorwire[metrics]'",
    )
    parser.add_argument(
        "--metrics-host",
        default=None,
        metavar="HOST",
        help="the interface --metrics-port listens on (default: the host of --bind)",
    )


def device_form(text: str) -> str:
    """An argparse type: ``cpu``, ``cuda`` or ``cuda:N`` (whether that GPU exists is checked
    where it is used). Before, a worker given ``--device cuda:x`` with a numpy model was told
    that numpy models train on the CPU, not that ``cuda:x`` names no device."""
    kind, colon, index = text.strip().lower().partition(":")
    if (kind, colon) in (("cpu", ""), ("cuda", "")) or (kind == "cuda" and index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: give cpu, cuda or cuda:N (N: a GPU's index)")


def add_heartbeat_flags(
    parser: argparse.ArgumentParser, peer: str, interval: float, timeout: float
) -> None:
    """``--heartbeat`` (this daemon's senders) and ``--heartbeat-timeout`` (its receivers), the
    same for both daemons; ``peer`` names the other side ("worker", "server")."""
    parser.add_argument(
        "--heartbeat",
        type=positive_seconds,
        default=interval,
        metavar="SECONDS",
        help=f"seconds between heartbeats to each {peer} (default {interval:g}; more "
        "often where its --heartbeat-timeout asks for it)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=positive_seconds,
        default=timeout,
        metavar="SECONDS",
        help=f"a {peer} silent this long is lost (default {timeout:g})",
    )


def start_metrics(
    args: argparse.Namespace, bind: str, source: Callable[[], Iterable[Metric]] | None = None
) -> MetricsServer | None:
    """Serve ``/metrics`` if ``--metrics-port`` was given (tensorwire's metrics and
    ``source``'s); None otherwise. Raises TensorWireError (one line) when it cannot."""
    if args.metrics_port is None:
        if args.metrics_host is not None:  # (served nothing, without a word)
            logging.getLogger("tensorwire").warning(
                "--metrics-host %s without --metrics-port serves no metrics: give the port too",
                args.metrics_host,
            )
        return None
    if not 0 <= args.metrics_port < 65536:
        raise tw.TensorWireError(f"--metrics-port {args.metrics_port} is not a port")
    host = socket_host(args.metrics_host or urlsplit(bind).hostname or "127.0.0.1")
    server = tw_metrics.serve(args.metrics_port, host, sources=[source] if source else [])
    logging.getLogger("tensorwire").info("metrics at %s", server.url)
    return server


def launcher_int(parser: argparse.ArgumentParser, *names: str) -> int | None:
    """The first of these environment variables that a launcher set (``RANK`` by torchrun,
    ``SLURM_PROCID`` by srun), as an integer; None if none is set."""
    for name in names:
        value = os.environ.get(name)
        if value:
            try:
                return int(value)
            except ValueError:
                parser.error(f"environment {name}={value!r} is not an integer")
    return None


def check_endpoint(
    parser: argparse.ArgumentParser, flag: str, endpoint: str, *, to_bind: bool = True
) -> None:
    """Refuse what is not ``tcp://HOST:PORT`` before anything uses it; port 0 (any free one)
    only in an address ``to_bind``, not in one to reach."""
    split = split_endpoint(endpoint)
    if split is None or (not to_bind and split[1] == 0):
        any_port = " (PORT 0: any)" if to_bind else ""
        parser.error(
            f"{flag} {endpoint!r} is not an address: use tcp://HOST:PORT{any_port}"
            f"{ipv6_hint(endpoint)}"
        )
    # a bind host that names nothing here was refused as one that needs a secret (a name to
    # reach may resolve later: a service whose DNS record comes once it is up)
    unresolvable = unresolvable_host(split[0]) if to_bind else None
    if unresolvable is not None:
        parser.error(f"{flag} {endpoint}: {unresolvable}")


def check_host(parser: argparse.ArgumentParser, flag: str, host: str) -> None:
    """Refuse what is neither an IP address nor a host name (``--advertise``): before, a URL or
    a host with a port went into the join, and the server failed to reach the worker later."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", host):
        parser.error(
            f"{flag} {host!r} is not a host name or address: give the host alone (10.0.0.5, "
            "worker-0.example), without tcp:// or a port"
        )


def is_loopback(endpoint: str) -> bool:
    """Does ``tcp://HOST:PORT`` listen only on this machine?"""
    return is_loopback_host(urlsplit(endpoint).hostname or "")


def add_secret_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--secret", default=None, help="shared secret (prefer --secret-file or TENSORWIRE_SECRET)"
    )
    parser.add_argument(
        "--secret-file",
        type=path,
        default=None,
        metavar="PATH",
        help="read the shared secret from this file",
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


def add_memory_flags(parser: argparse.ArgumentParser) -> None:
    """Where a daemon's receiver keeps the slots its peers write into (tensorwire.Receiver's
    ``shm``)."""
    parser.add_argument(
        "--no-shm",
        dest="shm",
        action="store_const",
        const=False,
        default=None,
        help="keep the receiving slots in this process's private memory (huge pages where the "
        "kernel allows) instead of /dev/shm: for peers on other hosts (tcp, nixl), whose writes "
        "land faster there; peers on this host then cannot use shm",
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


def resolve_secret(parser: DaemonParser, args: argparse.Namespace, bind: str) -> str | None:
    """The shared secret from --secret, --secret-file or TENSORWIRE_SECRET; required (the daemon
    refuses to start) when ``bind`` accepts connections from other hosts. A secret on the
    command line is taken with a warning (every user of the host can read it there), and two
    different secrets (--secret-file and TENSORWIRE_SECRET, say) are refused: either one
    chosen quietly would leave this daemon refused by peers that took the other."""
    check_endpoint(parser, "--bind", bind)
    secret = args.secret
    where = parser.source("--secret")
    if where is None or where == "the command line":
        named = "--secret"
    elif where.startswith("environment "):
        named = where.removeprefix("environment ")
    else:
        named = f"--secret (from {where})"
    if secret is not None and not secret.strip():
        # as the library refuses secret="": most likely a variable its template left empty
        parser.error(f"{named} is set but empty: give the job's secret, or leave it unset")
    if where == "the command line":
        logging.getLogger("tensorwire").warning(
            "--secret on the command line can be read by every user of this host (ps, "
            "/proc/PID/cmdline): give it with --secret-file PATH or TENSORWIRE_SECRET instead"
        )
    if args.secret_file:
        secret = read_secret_file(parser, args.secret_file, also=(secret, named))
    if not secret and not is_loopback(bind):
        parser.error(
            f"--bind {bind} accepts connections from other hosts, so a shared secret is "
            "required: pass --secret-file PATH or set TENSORWIRE_SECRET (the same on every "
            "server and worker)"
        )
    return secret or None


def read_secret_file(
    parser: argparse.ArgumentParser, path: str, also: tuple[str | None, str] = (None, "")
) -> str:
    """The shared secret in ``path`` (--secret-file), stripped; a usage error naming the file
    when it cannot be read or is empty, or when ``also`` (a secret given another way, and how
    it is named: ``TENSORWIRE_SECRET``) is a different one."""
    try:
        with open(path) as f:
            secret = f.read().strip()
            mode = os.fstat(f.fileno()).st_mode
    except OSError as exc:
        parser.error(f"cannot read --secret-file {path}: {exc.strerror}")
    if not secret:
        parser.error(f"--secret-file {path} is empty")
    other, named = also
    if other is not None and other.strip() != secret:
        parser.error(f"--secret-file {path} and {named} are different secrets: give it once")
    if mode & 0o044:
        # a warning, not ssh's refusal: mounted secrets (docker's, a Kubernetes volume's
        # default 0644) are often readable by all, in a container that has no other users
        logging.getLogger("tensorwire").warning(
            "--secret-file %s can be read by other users of this host (mode %04o): chmod 600 %s",
            path,
            stat.S_IMODE(mode),
            path,
        )
    return secret


def ignoring_late_stops(main: Callable[[], int]) -> int:
    """Run a daemon's ``main`` and return its exit status; from its end on, SIGTERM and SIGINT
    are ignored. Python puts a signal's default action back as the interpreter exits, so a
    stop that came then (an orchestrator's racing the daemon's own end: `ray-job` stops its
    lingering servers once the workers end) killed a daemon whose work was done, and its exit
    0 became -15, which Ray took for a crash and started the server again (a fresh clone's
    suite met it twice). A signal ignored stays ignored through the exit."""
    try:
        return main()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


def write_summary(path: str | None, summary: dict[str, Any], prog: str) -> int:
    """Write an end-of-job summary as JSON to ``path`` (--metrics), when one was given, whole
    (a reader polling for it never sees half): the daemon's exit status, 0, or 1 where it
    cannot be written (a full disk), said in one line."""
    if path:
        text = files.json_text(summary).encode()
        try:
            files.write_whole(path, lambda f: f.write(text))
        except OSError as exc:
            print(f"{prog}: error: cannot write --metrics {path}: {exc.strerror}", file=sys.stderr)
            return 1
    return 0


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv`` with the file and the environment merged in (see the module doc)."""
    args = parser.parse_args(argv)
    if getattr(args, "config_file", None) == "":
        # ConfigArgParse reads no file for an empty --config, as if none were given (its own
        # flag, which takes no type of ours): refused as every other empty path is
        parser.error("argument --config: '' is empty: give a path, or leave the flag out")
    return args
