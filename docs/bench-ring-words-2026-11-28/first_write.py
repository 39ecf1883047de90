import time, numpy as np, tensorwire as tw, statistics
from tensorwire.receiver import sessions
from tensorwire import control, sender as snd
N=500
names=[f"t{i}" for i in range(N)]
x=np.ones(16,np.float32)
ev=[]
orig=sessions.SessionHandler.handle
def timed(self, identity, msg):
    a=time.perf_counter(); r=orig(self, identity, msg); ev.append(("h0",a)); ev.append(("h1",time.perf_counter())); return r
sessions.SessionHandler.handle=timed
oe=control.ControlClient._exchange if hasattr(control,"ControlClient") else None
cls=[c for c in vars(control).values() if isinstance(c,type) and hasattr(c,"_exchange")][0]
oe=cls._exchange
def ex(self,*a,**k):
    t=time.perf_counter(); r=oe(self,*a,**k); ev.append(("x0",t)); ev.append(("x1",time.perf_counter())); return r
cls._exchange=ex
ow=snd.Sender.write
with tw.Receiver() as rx:
    rx.register_many([(n,(16,),"float32") for n in names])
    with tw.Sender.connect(rx.address, transport="shm", timeout=60) as tx:
        ev.clear(); tot=[]
        for n in names:
            t=time.perf_counter(); tx.write(n,x); tot.append(time.perf_counter()-t)
        d=dict(); 
        # pair events in order: x0? we appended after so order: h0,h1,x0,x1 per write
        req=[];srv=[];wrk=[]
        for i in range(0,len(ev),4):
            (_,h0),(_,h1),(_,x0),(_,x1)=ev[i:i+4]
            req.append(h0-x0); srv.append(h1-h0); wrk.append(x1-h1)
        m=lambda v: statistics.median(v)*1e6
        print(f"write {m(tot):.0f} us; exchange {m([a+b+c for a,b,c in zip(req,srv,wrk)]):.0f}: send->handle {m(req):.0f}, handle {m(srv):.0f}, handled->reply {m(wrk):.0f}")
