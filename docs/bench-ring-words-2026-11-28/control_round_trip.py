"""What tensorwire's control plane adds to a bare pyzmq exchange: the project's ControlServer
(ROUTER, one thread: decode, handler, encode, its tick after each message) and ControlClient
(DEALER: a poll for room to send, the send, a poll for the reply, decode) against a bare
ROUTER thread and a bare DEALER loop (encode, send, poll, recv, decode), each pairing in turn,
three rounds, all in one process over loopback TCP. The handler answers at once: what a
claim's handling adds is ``first_write.py``'s. Prints each pairing's median of 1,900."""

import statistics
import threading
import time

import zmq

from tensorwire import control, wire

ROUNDS, EXCHANGES, WARM = 3, 2000, 100
request = wire.Heartbeat(0, b"x" * 16)
answer = wire.encode(wire.Ack(0))


class Owner:
    def handle(self, identity: bytes, msg: wire.Message) -> wire.Message:
        return wire.Ack(0)

    def tick(self) -> None:
        pass


def median_us(times: list[float]) -> float:
    return statistics.median(times[WARM:]) * 1e6


def bare_client(address: str) -> float:
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(address)
    times = []
    for _ in range(EXCHANGES):
        began = time.perf_counter()
        dealer.send(wire.encode(request))
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.poll(1000)
        wire.decode(dealer.recv())
        times.append(time.perf_counter() - began)
    dealer.close()
    return median_us(times)


def control_client(address: str) -> float:
    client = control.ControlClient(address)
    times = []
    for _ in range(EXCHANGES):
        began = time.perf_counter()
        client.request(request, 10.0)
        times.append(time.perf_counter() - began)
    client.close()
    return median_us(times)


def bare_server() -> str:
    router = zmq.Context.instance().socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def serve() -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while True:
            if poller.poll(100):
                identity, payload = router.recv_multipart()
                wire.decode(payload)
                router.send_multipart([identity, answer])

    threading.Thread(target=serve, daemon=True).start()
    return f"tcp://127.0.0.1:{port}"


owner = Owner()
server = control.ControlServer("tcp://127.0.0.1:0", owner.handle, owner.tick)
bare = bare_server()
pairings = {
    "bare server, bare client": (bare, bare_client),
    "control server, bare client": (server.address, bare_client),
    "bare server, control client": (bare, control_client),
    "control server, control client": (server.address, control_client),
}
results: dict[str, list[float]] = {name: [] for name in pairings}
for _ in range(ROUNDS):
    for name, (address, run) in pairings.items():
        results[name].append(run(address))
for name, medians in results.items():
    print(f"{name}: " + ", ".join(f"{m:.0f}" for m in medians) + " us")
server.close()
