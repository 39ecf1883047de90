"""NIXL, the library under the ``nixl`` transport: finding it, configuring it, describing it.

NIXL (NVIDIA Inference Xfer Library) is optional. It ships as the ``nixl-cu12`` wheel, which
bundles a UCX built with InfiniBand verbs support, so the same code runs real RDMA on a fabric and
falls back to UCX's cross-memory-attach (``cma``) or TCP transports on an ordinary machine. The
wheel declares torch as a dependency, which host memory does not need: install it with
``pip install --no-deps nixl-cu12`` (``make rdma`` in the repository).

UCX reads most of its settings from ``UCX_*`` environment variables when an agent's context is
created. :class:`NixlOptions` is how a tensorwire user sets them: :func:`create_agent` applies them
for the duration of the agent's creation only (under a lock, restoring the environment afterwards),
so nobody has to export variables by hand and two agents in one process may differ.

Run ``python -m tensorwire.rdma`` (or ``tensorwire info``) to see what this machine offers.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .checks import check_count
from .errors import TransportError
from .process import open_files_hint

INSTALL_HINT = (
    "pip install --no-deps 'nixl-cu12==1.5.1' (--no-deps: its wheel declares torch, which host "
    "memory does not need; pip install 'tensorwire[nixl]' installs it with torch)"
)
#: Import names to try, in order: the CUDA 12 and 13 builds, then the `nixl` meta package.
MODULES = ("nixl_cu12", "nixl_cu13", "nixl")
#: NIXL logs every agent's creation at INFO on stdout; keep it to warnings unless asked.
DEFAULT_LOG_LEVEL = "WARN"

_ENV_LOCK = threading.Lock()
_loaded: ModuleType | None = None
_load_error: str | None = None


#: UCX transports that can move CUDA memory (one of them must be allowed on a GPU host)
CUDA_TRANSPORTS = frozenset({"cuda", "cuda_copy", "cuda_ipc", "gdr_copy"})


def cuda_devices_present() -> bool:
    """Does this host have an NVIDIA GPU (its driver lists one)? Checked without CUDA."""
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return os.path.exists("/dev/nvidia0")


def with_cuda_transport(tls: str) -> str:
    """``tls`` with ``cuda_copy`` added where it names transports but none for CUDA memory.

    On a host with GPUs NIXL's UCX backend refuses such a list ("NVIDIA GPU(s) are present, but
    this setting does not enable CUDA memory support. Add cuda_copy"), even for host memory. An
    exclusion list (``^...``) and ``all`` are left as they are."""
    names = [t.strip() for t in tls.split(",") if t.strip()]
    if tls.startswith("^") or "all" in names or CUDA_TRANSPORTS & set(names):
        return tls
    return ",".join([*names, "cuda_copy"])


@dataclass(frozen=True)
class NixlOptions:
    """How a ``nixl`` endpoint sets up NIXL and UCX (every field has a working default).

    ``progress_thread``: NIXL's own progress thread. Off by default: tensorwire already polls for
    completions and notifications, and on a 2-core machine the extra spinning thread cost
    throughput. ``net_devices``: UCX's ``UCX_NET_DEVICES`` (``"lo"``, ``"mlx5_0:1"``, ...); by
    default ``"lo"`` when the endpoint's control plane is on loopback, which keeps UCX's own
    listeners off the network, and UCX's choice otherwise. ``tls``: ``UCX_TLS``, the transports
    UCX may use (``"rc,cuda_copy"`` on an InfiniBand fabric, ``"cma,tcp"`` here); UCX's choice when
    None. ``env``: any other ``UCX_*`` setting, applied while the agent is created.
    ``registered_sources``: how many distinct source arrays a sender keeps registered (and their
    transfer requests prepared) so that writing the same array again costs no registration.
    ``copy_below``: a payload of at most this many bytes from an array that is not registered
    yet is copied into the tensor's registered staging buffer instead: registering an array and
    preparing its transfer cost ~30 µs here (far more where registration pins pages, as on
    InfiniBand), copying 64 KiB under 2 µs. 0 never copies.
    Settings a user exported in the environment are kept unless a field here overrides them.

    ``UCX_MM_ERROR_HANDLING`` stays at UCX's default (``n``) unless set here or exported. NIXL
    creates its endpoints with peer-failure handling, which UCX's shared-memory transports
    (``posix``, ``sysv``) offer only with ``y``: so by default the notifications between two
    processes of one host travel over ``tcp/lo``. ``y`` moves them into a FIFO in the receiver's
    shared memory, which is faster (raw NIXL's 4 KiB round trip on the 2-core VM: 7 µs against
    31) but not safe against a peer that dies: a process SIGKILLed while it writes a notification
    leaves an element of that FIFO never completed, and the receiving agent then hears no process
    of the host again, peers connected before included (reproduced with ``python -m
    tensorwire.bench.notifier_kills``; docs/rdma.md). Both ends on one host must agree (an agent
    with it and one without find no transport to each other).
    """

    progress_thread: bool = False
    net_devices: str | None = None
    tls: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    registered_sources: int = 16
    copy_below: int = 64 << 10

    def __post_init__(self) -> None:
        check_count("registered_sources", self.registered_sources, 1)
        check_count("copy_below", self.copy_below, 0)
        for key, value in self.env.items():
            if not key.startswith("UCX_") or not isinstance(value, str):
                raise ValueError(f"env takes UCX_* settings as strings, got {key!r}={value!r}")

    def environment(self, loopback: bool, gpus: bool | None = None) -> dict[str, str]:
        """The ``UCX_*`` variables to set while creating an agent. ``gpus``: whether this host
        has NVIDIA GPUs (looked up when None)."""
        env = dict(self.env)
        if self.net_devices is not None:
            env["UCX_NET_DEVICES"] = self.net_devices
        elif loopback and "UCX_NET_DEVICES" not in os.environ and "UCX_NET_DEVICES" not in env:
            env["UCX_NET_DEVICES"] = "lo"
        if self.tls is not None:
            env["UCX_TLS"] = self.tls
        tls = env.get("UCX_TLS")
        if tls is not None and (cuda_devices_present() if gpus is None else gpus):
            env["UCX_TLS"] = with_cuda_transport(tls)
        return env


def shared_memory_notifications(options: NixlOptions, loopback: bool) -> bool:
    """Would an agent created now with ``options`` have UCX's shared-memory error handling
    (``UCX_MM_ERROR_HANDLING``; UCX's default is off)? Two agents on one host must agree on it."""
    with _ENV_LOCK:  # as create_agent: another agent's temporary settings are not the user's
        value = options.environment(loopback).get(
            "UCX_MM_ERROR_HANDLING", os.environ.get("UCX_MM_ERROR_HANDLING", "n")
        )
    return value.strip().lower() in ("y", "yes", "on", "1", "true")


def installed() -> bool:
    """Is a NIXL build importable (checked without importing it)?"""
    for name in MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def load() -> ModuleType:
    """The NIXL Python module, or :class:`TransportError` saying how to install it."""
    global _loaded, _load_error
    if _loaded is not None:
        return _loaded
    if _load_error is None:
        os.environ.setdefault("NIXL_LOG_LEVEL", DEFAULT_LOG_LEVEL)
        errors = []
        for name in MODULES:
            try:
                module = importlib.import_module(name)
                module.nixl_agent  # noqa: B018 - the meta package without a build has none
            except (ImportError, AttributeError, OSError) as exc:
                errors.append(f"{name}: {exc}")
                continue
            _loaded = module
            return module
        _load_error = "; ".join(errors)
    raise TransportError(
        f"transport 'nixl' needs NIXL, which is not importable here: {INSTALL_HINT}"
    )


def is_remote_disconnect(exc: BaseException) -> bool:
    """Did NIXL raise ``exc`` because the remote agent is gone (``NIXL_ERR_REMOTE_DISCONNECT``)?
    Told by its type's name, which every NIXL build gives its bindings' exception, so that the
    bindings need not be imported here."""
    return type(exc).__name__ == "nixlRemoteDisconnectError"


#: The process that made this process's first NIXL agent, inherited by a forked child: UCX
#: must not be used again in a child forked from a process that used it ("it's OK to fork as
#: long as no RDMA or UCX API are used in the child", openucx/ucx#4325). Before, a forked
#: child's NIXL sender waited out its timeout ("did not answer a NIXL ping") amid UCX errors.
_ucx_user: int | None = None


def forked_from_ucx_user() -> int | None:
    """The pid of the process this one was forked from that used NIXL, if any."""
    return _ucx_user if _ucx_user is not None and _ucx_user != os.getpid() else None


def available() -> bool:
    if forked_from_ucx_user() is not None:
        return False
    try:
        load()
    except TransportError:
        return False
    return True


def create_agent(name: str, options: NixlOptions, loopback: bool) -> Any:
    """A NIXL agent with the UCX backend, created under ``options``' environment.

    The agent serialises its own calls (strict thread-sync mode): a receiver's polling thread and
    the threads that release slots (and so send credits) use it at the same time.
    """
    global _ucx_user
    parent = forked_from_ucx_user()
    if parent is not None:
        raise TransportError(
            f"this process was forked from process {parent}, which used NIXL: UCX cannot be used "
            "again in a forked child (openucx/ucx#4325). Start the child with the 'spawn' start "
            "method (multiprocessing.get_context('spawn'); a DataLoader's "
            "multiprocessing_context='spawn'), or use tcp or shm in it"
        )
    api = load()
    with _ENV_LOCK:
        # Under the lock: another thread's agent may be in its window, its settings exported
        # for the moment, and they must not pass for the user's own (which environment() keeps).
        env = options.environment(loopback)
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            config = api.nixl_agent_config(
                enable_prog_thread=options.progress_thread,
                backends=["UCX"],
                sync_mode=api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
            )
            agent = api.nixl_agent(name, config)
        except Exception as exc:  # NIXL raises its own exception types from C++
            # (UCX's sockets and contexts take descriptors: 8 an agent here)
            raise TransportError(f"cannot create a NIXL agent: {exc}{open_files_hint()}") from exc
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    if _ucx_user is None:
        _ucx_user = os.getpid()
    if "UCX" not in agent.backends:
        raise TransportError(
            "NIXL started without its UCX backend plugin (plugins found: "
            f"{', '.join(agent.get_plugin_list()) or 'none'})"
        )
    return agent


# --------------------------------------------------------------------------------------------
# What this machine offers (`tensorwire info`)
# --------------------------------------------------------------------------------------------


def _version(module: ModuleType) -> str:
    import importlib.metadata  # (here: about 35 ms that only `tensorwire info` needs)

    for dist in (module.__name__.replace("_", "-"), "nixl"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return "unknown"


def describe() -> dict[str, Any]:
    """NIXL's availability, version and plugins, and the UCX transports it sees."""
    try:
        module = load()
    except TransportError as exc:
        return {"available": False, "error": str(exc), "detail": _load_error}
    out: dict[str, Any] = {
        "available": True,
        "module": module.__name__,
        "version": _version(module),
        "plugins": sorted(
            os.path.basename(p)[len("libplugin_") : -len(".so")]
            for p in glob.glob(os.path.join(_libs_dir(module), "nixl", "libplugin_*.so"))
        ),
    }
    # Listing UCX's resources loads UCX's transport modules through ctypes: do it in a child, so
    # that an unexpected UCX build can at worst fail that child, never this process.
    try:
        child = subprocess.run(
            [sys.executable, "-m", "tensorwire.rdma", "--ucx-json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        out.update(json.loads(child.stdout))
    except (subprocess.SubprocessError, ValueError, OSError) as exc:
        out["ucx_error"] = f"could not list UCX transports: {exc}"
    return out


class _ComponentAttr(ctypes.Structure):  # uct_component_attr_t (UCX >= 1.8)
    _fields_ = (
        ("field_mask", ctypes.c_uint64),
        ("name", ctypes.c_char * 16),
        ("md_resource_count", ctypes.c_uint),
        ("md_resources", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
    )


class _TlResource(ctypes.Structure):  # uct_tl_resource_desc_t (UCX >= 1.10)
    _fields_ = (
        ("tl_name", ctypes.c_char * 10),
        ("dev_name", ctypes.c_char * 32),
        ("dev_type", ctypes.c_int),
        ("sys_device", ctypes.c_uint8),
    )


def _libs_dir(module: ModuleType) -> str:
    # auditwheel puts the bundled libraries (renamed with a hash) beside the package
    site = os.path.dirname(os.path.dirname(module.__file__ or ""))
    return os.path.join(site, f"{module.__name__}.libs")


def _ucx_library(module: ModuleType, stem: str) -> ctypes.CDLL:
    found = sorted(glob.glob(os.path.join(_libs_dir(module), f"{stem}-*.so*")))
    return ctypes.CDLL(found[0] if found else f"{stem}.so.0")


def ucx_resources() -> dict[str, Any]:
    """UCX's version and every transport/device pair it can open (what ``ucx_info -d`` lists)."""
    module = load()
    importlib.import_module(f"{module.__name__}._bindings")  # maps the wheel's UCX libraries
    ucp = _ucx_library(module, "libucp")
    ucp.ucp_get_version_string.restype = ctypes.c_char_p
    uct = _ucx_library(module, "libuct")
    components = ctypes.POINTER(ctypes.c_void_p)()
    count = ctypes.c_uint()
    if uct.uct_query_components(ctypes.byref(components), ctypes.byref(count)) != 0:
        raise RuntimeError("uct_query_components failed")
    transports: list[str] = []
    try:
        for i in range(count.value):
            component = ctypes.c_void_p(components[i])
            attr = _ComponentAttr(field_mask=0b11)  # name, md_resource_count
            if uct.uct_component_query(component, ctypes.byref(attr)) != 0:
                continue
            names = (ctypes.c_char * 16 * attr.md_resource_count)()
            attr.field_mask = 0b100  # md_resources
            attr.md_resources = ctypes.cast(names, ctypes.c_void_p)
            if uct.uct_component_query(component, ctypes.byref(attr)) != 0:
                continue
            for md_name in names:
                transports += _md_transports(uct, component, bytes(md_name).split(b"\0")[0])
    finally:
        uct.uct_release_component_list(components)
    version = ucp.ucp_get_version_string().decode()
    return {"ucx_version": version, "ucx_transports": sorted(set(transports))}


def _md_transports(uct: ctypes.CDLL, component: ctypes.c_void_p, md_name: bytes) -> list[str]:
    config = ctypes.c_void_p()
    if uct.uct_md_config_read(component, None, None, ctypes.byref(config)) != 0:
        return []
    md = ctypes.c_void_p()
    status = uct.uct_md_open(component, md_name, config, ctypes.byref(md))
    uct.uct_config_release(config)
    if status != 0:
        return []
    out = []
    try:
        resources = ctypes.POINTER(_TlResource)()
        n = ctypes.c_uint()
        if uct.uct_md_query_tl_resources(md, ctypes.byref(resources), ctypes.byref(n)) == 0:
            for k in range(n.value):
                r = resources[k]
                out.append(f"{r.tl_name.decode()}/{r.dev_name.decode()}")
            uct.uct_release_tl_resource_list(resources)
    finally:
        uct.uct_md_close(md)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--ucx-json"]:
        print(json.dumps(ucx_resources()))
        return 0
    print(json.dumps(describe(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
