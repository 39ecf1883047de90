import zmq, threading, time, statistics
ctx=zmq.Context.instance()
r=ctx.socket(zmq.ROUTER); port=r.bind_to_random_port("tcp://127.0.0.1")
def serve():
    p=zmq.Poller(); p.register(r,zmq.POLLIN)
    while True:
        if p.poll(100):
            f=r.recv_multipart()
            if f[-1]==b"q": break
            r.send_multipart(f)
threading.Thread(target=serve,daemon=True).start()
d=ctx.socket(zmq.DEALER); d.connect(f"tcp://127.0.0.1:{port}")
ts=[]
for i in range(2000):
    t=time.perf_counter(); d.send(b"x"*64); 
    p=zmq.Poller(); p.register(d,zmq.POLLIN); p.poll(1000); d.recv(); ts.append(time.perf_counter()-t)
print("raw zmq rtt median us", statistics.median(ts[100:])*1e6)
d.send(b"q")
