"""CPU-machine check (session 85): torch unbind(0) of 1000 rows (CPU tensors) and a
pure-Python loop, each the median of 10 blocks of 40 calls, before and after importing
the module named as the argument (`none`: nothing), in one process. Run with torch 2.11
and tensordict 0.15.3 from PyPI: python td_import_cpu.py tensordict"""
import sys, time, statistics, importlib
import torch
base=torch.randn(1000,256)
def unbind():
    t0=time.perf_counter()
    with torch.no_grad(): r=base.unbind(0)
    del r
    return time.perf_counter()-t0
def loop():
    t0=time.perf_counter(); x=0
    for i in range(20000): x+=i&7
    return time.perf_counter()-t0
def med(f,n=400): return statistics.median(f() for _ in range(n))*1e6
def both():
    u=[];l=[]
    for _ in range(10):
        u.append(med(unbind,40)); l.append(med(loop,40))
    return round(statistics.median(u),1), round(statistics.median(l),1)
b=both()
if sys.argv[1]!="none": importlib.import_module(sys.argv[1])
a=both()
print(sys.argv[1], "unbind/loop before", b, "after", a, "unbind ratio", round(a[0]/b[0],3), "loop ratio", round(a[1]/b[1],3))
