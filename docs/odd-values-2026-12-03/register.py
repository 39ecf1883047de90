import itertools

import numpy as np

import tensorwire as tw

odd = [
    None,
    -1,
    0,
    1.5,
    float("nan"),
    "x",
    "",
    (),
    (0,),
    (-1,),
    (2**40,),
    (2**62, 2**62),
    [3],
    (3.0,),
    (True,),
    ("3",),
    b"f4",
    "float32",
    "f4",
    "object",
    "U4",
    "V8",
    "complex64",
    "bool",
    "int4",
    np.float32,
    object,
    "bfloat16",
    "float8_e4m3fn",
    10**30,
    {"a": 1},
]
kinds = {}
oks = []
with tw.Receiver(bind="tcp://127.0.0.1:0") as rx:
    for i, (shape, dtype) in enumerate(itertools.product(odd, odd)):
        try:
            rx.register(f"t{i}", shape, dtype)
            oks.append((shape, dtype))
        except Exception as e:
            kinds.setdefault(type(e).__name__, []).append((shape, dtype, str(e)[:150]))
for k, v in kinds.items():
    print(k, len(v), v[:3])
print("ok:", oks)
