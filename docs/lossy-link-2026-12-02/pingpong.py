"""A raw-socket ping-pong of SIZE bytes each way, N times, as a parameter-server step moves
gradients up and parameters down: `one` connection both ways, `two` (one a direction, as
tensorwire's senders have), or `two-credit` (and a 16-byte credit back on the first after each
message, as tensorwire's tcp receiver sends). Run by pingpong.sh through the slow lossy link."""

import socket
import sys
import time

role, mode, host = sys.argv[1:4]
size, n = int(sys.argv[4]), int(sys.argv[5])
PORT_UP, PORT_DOWN = 5999, 5998
payload = bytearray(size)
into = memoryview(bytearray(size))
credit = memoryview(bytearray(16))


def recv_exact(s: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = s.recv_into(view[got:])
        if not k:
            raise EOFError
        got += k


def nodelay(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def listen(addr: str, port: int) -> socket.socket:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen()
    return ls


if role == "server":  # host: its own address; argv[6]: the client's, for the second connection
    up = nodelay(listen(host, PORT_UP).accept()[0])
    down = up if mode == "one" else nodelay(socket.create_connection((sys.argv[6], PORT_DOWN)))
    for _ in range(n):
        recv_exact(up, into)
        if mode == "two-credit":
            up.sendall(b"c" * 16)
        down.sendall(payload)
else:  # host: the server's address
    ls = None if mode == "one" else listen("0.0.0.0", PORT_DOWN)
    up = nodelay(socket.create_connection((host, PORT_UP)))
    down = up if ls is None else nodelay(ls.accept()[0])
    start = time.monotonic()
    for _ in range(n):
        up.sendall(payload)
        recv_exact(down, into)
        if mode == "two-credit":
            recv_exact(up, credit)
    print(f"{mode}: {n} round trips of {size} bytes in {time.monotonic() - start:.2f} s")
