"""A bare pyzmq DEALER-ROUTER exchange between two threads of one process, over loopback TCP:
the floor under a claim's round trip (``first_write.py``). Prints the median of 1,900."""

import statistics
import threading
import time

import zmq

ctx = zmq.Context.instance()
router = ctx.socket(zmq.ROUTER)
port = router.bind_to_random_port("tcp://127.0.0.1")


def serve() -> None:
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    while True:
        if poller.poll(100):
            frames = router.recv_multipart()
            if frames[-1] == b"q":
                break
            router.send_multipart(frames)


threading.Thread(target=serve, daemon=True).start()
dealer = ctx.socket(zmq.DEALER)
dealer.connect(f"tcp://127.0.0.1:{port}")
times = []
for _ in range(2000):
    began = time.perf_counter()
    dealer.send(b"x" * 64)
    waiting = zmq.Poller()
    waiting.register(dealer, zmq.POLLIN)
    waiting.poll(1000)
    dealer.recv()
    times.append(time.perf_counter() - began)
print("raw zmq rtt median us", statistics.median(times[100:]) * 1e6)
dealer.send(b"q")
