#!/usr/bin/env python3
# Whether the disk takes several writers' syncs at once: N processes, each COUNT times a 64-byte
# pwrite and fdatasync into its own posix_fallocate'd file in DIR. Prints each process's p50 and
# the syncs per second of all of them together. usage: scripts/fsync-parallel.py N COUNT DIR
import os, sys, time, statistics
from multiprocessing import Process, Queue
def worker(i, count, d, q):
    path = os.path.join(d, f"fsyncpar-{i}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.posix_fallocate(fd, 0, 64 * count + 4096); os.fsync(fd)
    lat = []
    t0 = time.perf_counter()
    for k in range(count):
        a = time.perf_counter()
        os.pwrite(fd, b"x" * 64, 64 * k)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - a)
    q.put((statistics.median(lat) * 1e6, count / (time.perf_counter() - t0)))
    os.close(fd); os.unlink(path)
n, count, d = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
q = Queue(); ps = [Process(target=worker, args=(i, count, d, q)) for i in range(n)]
[p.start() for p in ps]; [p.join() for p in ps]
res = [q.get() for _ in ps]
print(f"procs={n} p50_us={' '.join(f'{r[0]:.0f}' for r in res)} syncs_per_s_total={sum(r[1] for r in res):.0f}")
