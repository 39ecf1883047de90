import sys

import numpy as np
import torch

import tensorwire as tw

vals = [
    None,
    1,
    1.5,
    "abc",
    b"abcd" * 4,
    bytearray(16),
    memoryview(bytearray(16)),
    [1.0] * 4,
    (1.0,) * 4,
    {"a": 1},
    np.zeros(4, np.float32),
    np.zeros((2, 2), np.float32),
    np.zeros(4, np.float64),
    np.zeros(4, np.float32)[::2],
    np.zeros(0, np.float32),
    np.zeros(4, np.float32).view([("a", "f4")]),
    np.ma.zeros(4, np.float32),
    np.float32(1),
    torch.zeros(4),
    torch.zeros(4, dtype=torch.float64),
    torch.zeros(4).t(),
    torch.zeros(8)[::2],
    torch.zeros(4, requires_grad=True),
    torch.zeros(4, dtype=torch.bfloat16),
    np.zeros(4, np.float32).astype(">f4"),
    np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (4,), (0,)),
    object(),
]
bad = []
for transport in sys.argv[1:]:
    with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
        rx.register("x", (4,), "float32")
        with tw.Sender.connect(rx.address, transport=transport) as tx:
            for v in vals:
                try:
                    tx.write("x", v, timeout=2)
                    got = rx.wait("x", timeout=2)
                    ok = np.array(got).copy()
                    rx.release("x")
                    print(transport, "landed", type(v).__name__, getattr(v, "dtype", None), ok)
                except tw.TensorWireError as e:
                    print(transport, "refused", type(v).__name__, type(e).__name__, str(e)[:120])
                except Exception as e:
                    bad.append((transport, repr(v)[:60], repr(e)[:200]))
            for v in vals:
                try:
                    tx.write_many({"x": v}, timeout=2)
                    rx.wait("x", timeout=2)
                    rx.release("x")
                except tw.TensorWireError:
                    pass
                except Exception as e:
                    bad.append(("many", transport, repr(v)[:60], repr(e)[:200]))
print("BAD", len(bad))
for b in bad:
    print(b)
