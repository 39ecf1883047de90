import inspect
import signal
import sys

import numpy as np

import tensorwire as tw

odd = [
    None,
    -1,
    0,
    1.5,
    float("nan"),
    float("inf"),
    "x",
    "",
    True,
    10**30,
    b"x",
    [],
    {},
    (),
    ("x",),
    [("x", None)],
    object(),
    np.float32(1),
]


def h(*a):
    raise TimeoutError("HANG")


signal.signal(signal.SIGALRM, h)
bad = []
transport = sys.argv[1]
with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
    rx.register("x", (4,), "float32")
    rx.register("d", (None,), "float32", max_bytes=64)
    with tw.Sender.connect(rx.address, transport=transport, timeout=2) as tx:
        arr = np.ones(4, np.float32)
        calls = {
            "tx.write name": lambda v: tx.write(v, arr),
            "tx.write timeout": lambda v: tx.write("x", arr, timeout=v),
            "tx.write shape?": lambda v: (
                tx.write("d", arr, shape=v)
                if "shape" in inspect.signature(tx.write).parameters
                else None
            ),
            "tx.write_many": lambda v: tx.write_many(v),
            "tx.write_many timeout": lambda v: tx.write_many({"x": arr}, timeout=v),
            "tx.buffer name": lambda v: tx.buffer(v).__enter__(),
            "tx.buffer shape": lambda v: tx.buffer("d", shape=v).__enter__(),
            "tx.spec": lambda v: tx.spec(v),
            "rx.wait name": lambda v: rx.wait(v, timeout=0.1),
            "rx.wait timeout": lambda v: rx.wait("x", timeout=v),
            "rx.wait_any timeout": lambda v: rx.wait_any(timeout=v),
            "rx.wait_all names": lambda v: rx.wait_all(v, timeout=0.1),
            "rx.wait_each names": lambda v: list(rx.wait_each(v, timeout=0.1)),
            "rx.release": lambda v: rx.release(v),
            "rx.release_many": lambda v: rx.release_many(v),
            "rx.drain": lambda v: rx.drain(v),
            "rx.pending": lambda v: rx.pending(v),
            "rx.unregister?": lambda v: rx.unregister(v) if hasattr(rx, "unregister") else None,
            "rx.register name": lambda v: rx.register(v, (2,), "float32"),
            "rx.register ring": lambda v: rx.register("r", (2,), "float32", ring=v),
            "rx.register max_bytes": lambda v: rx.register("m", (None,), "float32", max_bytes=v),
            "rx.register device": lambda v: rx.register("g", (2,), "float32", device=v),
        }
        for cname, call in calls.items():
            for v in odd:
                signal.alarm(8)
                try:
                    call(v)
                    res = "ok"
                except (tw.TensorWireError, ValueError, TypeError, KeyError) as e:
                    res = type(e).__name__
                    if isinstance(e, KeyError) and not isinstance(e, tw.TensorWireError):
                        bad.append((cname, repr(v)[:30], "bare KeyError " + str(e)[:80]))
                except TimeoutError:
                    bad.append((cname, repr(v)[:30], "HANG"))
                    res = "hang"
                except Exception as e:
                    bad.append((cname, repr(v)[:30], repr(e)[:160]))
                    res = "bad"
                finally:
                    signal.alarm(0)
                # drain anything that landed
                try:
                    while True:
                        n, _ = rx.wait_any(timeout=0)
                        rx.release(n)
                except Exception:
                    pass
print(transport, "BAD", len(bad))
for b in bad:
    print(b)
