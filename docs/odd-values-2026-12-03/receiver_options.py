import inspect
import signal

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
    "tcp://127.0.0.1:99999",
    "tcp://[::1]:0",
    b"x",
    [],
    {},
]


def sig_handler(*a):
    raise TimeoutError("hang")


signal.signal(signal.SIGALRM, sig_handler)
bad = []
# Receiver kwargs
params = [
    p
    for p in inspect.signature(tw.Receiver).parameters.values()
    if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
]
print("Receiver params", [p.name for p in params])
for p in params:
    for v in odd:
        kw = {"bind": "tcp://127.0.0.1:0"}
        kw[p.name] = v
        signal.alarm(10)
        try:
            with tw.Receiver(**kw) as rx:
                pass
            res = "ok"
        except (tw.TensorWireError, ValueError, TypeError) as e:
            res = type(e).__name__ + ": " + str(e)[:100]
        except Exception as e:
            res = "BAD " + repr(e)[:150]
            bad.append((p.name, v, res))
        finally:
            signal.alarm(0)
        if res == "ok" and v not in (None, 0, "", True, False):
            print("accepted", p.name, repr(v)[:40])
print("BAD", bad)
