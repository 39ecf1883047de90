import sys, collections
rows=[]
for l in open(sys.argv[1]):
    c,w,s,wk,n = l.rstrip("\n").split(" ", 4)
    rows.append((float(c),float(w),float(s),wk,n))
t0=min(r[2] for r in rows); t1=max(r[2]+r[1] for r in rows)
print("span", round(t1-t0), "cpu", round(sum(r[0] for r in rows)))
bins=collections.defaultdict(float); busy=collections.defaultdict(float)
for c,w,s,wk,n in rows:
    a=s-t0; b=a+w
    if w<=0: continue
    rate=c/w; t=a
    while t<b:
        k=int(t//60); e=min(b,(k+1)*60)
        bins[k]+=rate*(e-t); busy[k]+=(e-t); t=e
for k in sorted(bins):
    print(f"{k*60:4d}s  workers busy {busy[k]/60:4.2f}  cores used by tests {bins[k]/60:4.2f}")
ends=collections.defaultdict(float)
for c,w,s,wk,n in rows: ends[wk]=max(ends[wk], s+w-t0)
print("each worker's last end:", {k: round(v) for k,v in sorted(ends.items())})
for c,w,s,wk,n in sorted(rows, key=lambda r: -(r[2]+r[1]))[:10]:
    print(f"{s-t0:6.0f} +{w:5.1f}s cpu {c:5.1f} {wk} {n}")
