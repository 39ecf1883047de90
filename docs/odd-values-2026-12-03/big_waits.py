import numpy as np

import tensorwire as tw

for kw in (
    {"heartbeat_timeout": 1e30},
    {"frame_timeout": 1e30},
    {"heartbeat_timeout": float("inf")},
    {"max_connections": 10**30},
):
    try:
        with tw.Receiver(bind="tcp://127.0.0.1:0", **kw) as rx:
            rx.register("x", (4,), "float32")
            with tw.Sender.connect(rx.address, transport="tcp", timeout=5) as tx:
                tx.write("x", np.ones(4, np.float32))
                print(kw, "ok", rx.wait("x", timeout=5))
                rx.release("x")
    except Exception as e:
        print(kw, type(e).__name__, str(e)[:200])
for kw in ({"timeout": 1e30}, {"heartbeat": 1e30}, {"timeout": float("inf")}):
    try:
        with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
            rx.register("x", (4,), "float32")
            with tw.Sender.connect(rx.address, transport="tcp", **kw) as tx:
                tx.write("x", np.ones(4, np.float32))
                print(kw, "ok", rx.wait("x", timeout=5))
                rx.release("x")
    except Exception as e:
        print(kw, type(e).__name__, str(e)[:200])
