"""What a parameter server answers once its job is done (``tensorwire-ps --linger``).

A worker started again after its servers ended the job (an orchestrator restarting a failed
pod, a machine that came back) found nobody at their address: it waited for them until its
``--connect-timeout`` and exited 1, and where the worker is restarted on failure (a Kubernetes
Job) it was started again, to the same end, until the orchestrator gave up and called the
job failed. An orchestrator that restarts every server that exits (a Kubernetes StatefulSet)
restarts one whose job is done, too.

For ``--linger`` seconds (or until SIGTERM) a server whose job is done keeps its endpoint
answering with a receiver of no tensors, whose published facts say at which step the job ended
(``job.done``, :func:`tensorwire.job.plan.job_done`): a worker that joins then reads it and exits
0, and ``tensorwire ping`` still answers (a readiness probe stays green). The job's receiver
and the memory it registered are given back first: only the control plane lingers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import tensorwire as tw
from tensorwire import curve
from tensorwire.endpoint import split_endpoint, tcp_endpoint

from .ps import PSConfig, open_receiver

log = logging.getLogger("tensorwire.ps")

#: How long a lingering server tries to bind the job's endpoint again: the job's receiver has
#: just closed it, and ZeroMQ lets a port go on its own I/O thread, a moment later
REBIND_WITHIN = 5.0
#: How often a lingering server looks whether it was stopped. It polls a flag that the signal
#: handler sets: a ``threading.Event`` set from a handler can deadlock, as the handler runs on
#: the very thread that may hold the event's lock inside its own ``wait``.
LOOK_EVERY = 0.1
#: Seconds a server that heard from a worker that another server ended the job (it was lost,
#: frozen, or restarted behind the end) answers that the job is done, at least: the other
#: workers that wait to tell it (their --reconnect-timeout, PSClient._tell_end) then see that
#: it knows, rather than find nobody, and wait on until their timeout (120 s by default).
ENDED_ELSEWHERE_LINGER = 5.0


def endpoint_again(bind: str, address: str) -> str:
    """Where to answer: ``bind`` as the job was served at, its port the one it was given when
    ``bind`` let the system choose (port 0), read from the job receiver's ``address``."""
    wanted = split_endpoint(bind)
    given = split_endpoint(address)
    if wanted is None or given is None or wanted[1] != 0:
        return bind
    return tcp_endpoint(wanted[0], given[1])


def answer_done(
    cfg: PSConfig,
    address: str,
    published: dict[str, object],
    stopped: Callable[[], bool],
) -> tw.Receiver | None:
    """Open the receiver that says the job is done (``published``, with ``job.done``) at the
    job's endpoint (``address``: where it was served), or None, logged, where the endpoint
    cannot be had again. The caller waits (:func:`linger`) and closes it."""
    endpoint = endpoint_again(cfg.bind, address)
    keys = curve.load(cfg.curve_keys) if cfg.curve_keys else None
    deadline = time.monotonic() + REBIND_WITHIN
    while True:
        try:
            return open_receiver(cfg, endpoint, published, keys)
        except tw.TensorWireError as exc:
            if stopped() or time.monotonic() >= deadline:
                log.warning("cannot answer at %s once the job is done: %s", endpoint, exc)
                return None
            time.sleep(LOOK_EVERY)


def linger(
    cfg: PSConfig,
    address: str,
    published: dict[str, object],
    seconds: float,
    stopped: Callable[[], bool],
) -> None:
    """Answer at the job's endpoint that the job is done for ``seconds`` (``math.inf``: until
    stopped), or until ``stopped()`` says so (SIGTERM)."""
    rx = answer_done(cfg, address, published, stopped)
    if rx is None:
        return
    try:
        forever = math.isinf(seconds)
        log.info(
            "the job is done: answering at %s that it is, %s",
            rx.address,
            "until stopped" if forever else f"for {seconds:g} s (--linger)",
        )
        until = time.monotonic() + seconds
        while not stopped() and (left := until - time.monotonic()) > 0:
            time.sleep(min(LOOK_EVERY, left))
    finally:
        rx.close()
