"""``python -m tensorwire.bench.notifier_kills``: does a NIXL peer SIGKILLed while it sends
notifications leave the receiving agent deaf?

Why it exists: with ``UCX_MM_ERROR_HANDLING=y``, UCX carries NIXL's notifications between
processes of one host through a FIFO in the receiver's shared memory. A sender takes a FIFO
element (an atomic increment of the FIFO's head), fills it, then marks it complete; the receiver
reads the elements in order. A sender killed between taking an element and marking it leaves an
element that is never complete, and every later notification from every process on the host waits
behind it for good. With UCX's default (``n``) the notifications go over ``tcp`` on loopback, where
the kernel discards what a dead sender left half sent.

What it does: one receiving agent, and one peer (the prober) connected to it from the start.
Each round starts a spammer process that sends notifications of ``--payload`` bytes (larger
ones take longer to fill, so a kill lands inside that window more often) in a loop, SIGKILLs it
at a random moment, and has the prober send a ping, which the receiver must hear within
``--wait`` seconds. The first ping not heard ends the run, after ``--later`` more pings, which
tell whether the deafness lasts. Bounded: ``--rounds``, and each wait.

Run it for each setting, e.g. ``--mm-error-handling y`` then ``n``, with the same ``--seed``.
Only NIXL's public API, through :func:`tensorwire.rdma.create_agent`; no tensorwire data path.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from tensorwire import NixlOptions, TensorWireError, rdma


def _options(mm: str) -> NixlOptions:
    return NixlOptions(env={"UCX_MM_ERROR_HANDLING": mm})


def _name(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _receiver(conn: Connection, mm: str) -> None:
    """Poll notifications; report each ping (``b"ping N"``) as ``N``; stop on ``None``."""
    agent: Any = rdma.create_agent("receiver", _options(mm), True)
    conn.send(agent.get_agent_metadata())
    while not (conn.poll(0) and conn.recv() is None):
        for _remote, messages in agent.get_new_notifs().items():
            for message in messages:
                if message.startswith(b"ping "):
                    conn.send(int(message.split()[1]))
        time.sleep(0.0005)


def _prober(conn: Connection, metadata: bytes, mm: str) -> None:
    """Connected before any spammer; sends ``ping N`` for each ``N`` it is given (None: stop)."""
    agent: Any = rdma.create_agent("prober", _options(mm), True)
    remote = _name(agent.add_remote_agent(metadata))
    agent.make_connection(remote)
    conn.send("ready")
    while True:
        if conn.poll(0.001):
            number = conn.recv()
            if number is None:
                return
            agent.send_notif(remote, f"ping {number}".encode())
        agent.get_new_notifs()  # progress: the ping's send, and the connection's upkeep


def _spammer(metadata: bytes, mm: str, name: str, payload: int, started: Connection) -> None:
    """Send notifications of ``payload`` bytes until killed."""
    agent: Any = rdma.create_agent(name, _options(mm), True)
    remote = _name(agent.add_remote_agent(metadata))
    agent.make_connection(remote)
    message = b"x" * payload
    started.send("spamming")
    sent = 0
    while True:
        agent.send_notif(remote, message)
        sent += 1
        if sent % 64 == 0:
            agent.get_new_notifs()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The rounds; what became of the pings."""
    ctx = mp.get_context("spawn")
    rng = random.Random(args.seed)
    to_receiver, receiver_end = ctx.Pipe()
    to_prober, prober_end = ctx.Pipe()
    receiver = ctx.Process(target=_receiver, args=(receiver_end, args.mm_error_handling))
    receiver.start()
    children = [receiver]
    result: dict[str, Any] = {"mm_error_handling": args.mm_error_handling, "rounds": 0}
    try:
        if not to_receiver.poll(60):
            raise TensorWireError("the receiving agent did not start within 60 s")
        metadata = to_receiver.recv()
        prober = ctx.Process(target=_prober, args=(prober_end, metadata, args.mm_error_handling))
        prober.start()
        children.append(prober)
        if not to_prober.poll(60):
            raise TensorWireError("the prober did not start within 60 s")
        to_prober.recv()

        def heard(number: int) -> bool:
            to_prober.send(number)
            deadline = time.monotonic() + args.wait
            while (left := deadline - time.monotonic()) > 0 and to_receiver.poll(left):
                if to_receiver.recv() == number:
                    return True
            return False

        if not heard(0):
            raise TensorWireError("the receiver did not hear the prober before any kill")
        for round_ in range(1, args.rounds + 1):
            started, started_end = ctx.Pipe()
            spammer = ctx.Process(
                target=_spammer,
                args=(
                    metadata,
                    args.mm_error_handling,
                    f"spammer-{round_}",
                    args.payload,
                    started_end,
                ),
            )
            spammer.start()
            children.append(spammer)
            if started.poll(60):
                time.sleep(rng.uniform(0.05, 0.5))  # spamming meanwhile
            os.kill(spammer.pid or 0, signal.SIGKILL)
            spammer.join(10)
            children.remove(spammer)
            result["rounds"] = round_
            if not args.quiet:
                print(f"round {round_}: spammer killed", end="", flush=True)
            if heard(round_):
                if not args.quiet:
                    print(", the receiver hears the prober", flush=True)
                continue
            later = sum(heard(1000 + k) for k in range(args.later))
            result["deaf_after_kill"] = round_
            result["later_pings_heard"] = later
            if not args.quiet:
                print(
                    f", the receiver no longer hears the prober; of {args.later} later pings "
                    f"it heard {later}",
                    flush=True,
                )
            break
    finally:
        with_prober = len(children) > 1
        if with_prober:
            to_prober.send(None)
        to_receiver.send(None)
        for child in children:
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join(5)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorwire.bench.notifier_kills",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=(
            "SIGKILL NIXL peers while they send notifications, and see whether the receiving "
            "agent still hears a peer that was connected all along."
        ),
    )
    parser.add_argument(
        "--mm-error-handling",
        choices=("y", "n"),
        default="n",
        help="UCX_MM_ERROR_HANDLING of every agent: y sends notifications between processes of "
        "one host through UCX's shared-memory FIFO, n (UCX's and tensorwire's default) over tcp",
    )
    parser.add_argument("--rounds", type=int, default=40, help="spammers killed at most")
    parser.add_argument("--payload", type=int, default=1000, help="bytes per spammed notification")
    parser.add_argument("--wait", type=float, default=10.0, help="seconds a ping may take")
    parser.add_argument("--later", type=int, default=3, help="pings sent after the first unheard")
    parser.add_argument("--seed", type=int, default=1, help="of the random kill moments")
    parser.add_argument("--quiet", action="store_true", help="only the summary line")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.payload < 1 or args.wait <= 0 or args.later < 0:
        parser.error("--rounds and --payload must be at least 1, --wait above 0, --later >= 0")
    try:
        rdma.load()
    except TensorWireError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    result = run(args)
    deaf = result.get("deaf_after_kill")
    print(
        f"UCX_MM_ERROR_HANDLING={result['mm_error_handling']}: "
        + (
            f"the receiver stopped hearing a connected peer after kill {deaf} "
            f"(and heard {result['later_pings_heard']} of {args.later} later pings)"
            if deaf is not None
            else f"the receiver heard the peer after each of {result['rounds']} kills"
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
