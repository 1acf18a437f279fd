#!/usr/bin/env python3
# fdatasync latency after appending a record: to a growing file, inside a zero-filled region, and
# inside a posix_fallocate'd region (whose extents are allocated but unwritten, so the first
# write into each block converts it).
# usage: scripts/fsync-prealloc.py [COUNT] [RECORD_BYTES] (writes in the current directory;
# defaults 2000 and 200). Prints the p50, mean and p90 of each, three rounds.
import os, time, statistics, sys
N=int(sys.argv[1]) if len(sys.argv)>1 else 2000
rec=b'x'*(int(sys.argv[2]) if len(sys.argv)>2 else 200)
def run(path, mode):
    fd=os.open(path, os.O_CREAT|os.O_TRUNC|os.O_WRONLY, 0o644)
    size=N*len(rec)+4096
    if mode=='zero': os.pwrite(fd, b'\0'*size, 0); os.fsync(fd)
    if mode=='falloc': os.posix_fallocate(fd, 0, size); os.fsync(fd)
    lat=[]; off=0
    for i in range(N):
        os.pwrite(fd, rec, off); off+=len(rec)
        t=time.perf_counter_ns(); os.fdatasync(fd); lat.append((time.perf_counter_ns()-t)/1000)
    os.close(fd); os.unlink(path)
    lat.sort(); return statistics.median(lat), statistics.mean(lat), lat[len(lat)*9//10]
for r in range(3):
    res={m: run(f'fsync-{m}.bin', m) for m in ['extend','zero','falloc']}
    print(f"round {r} record={len(rec)}B: " + "  ".join(f"{m} p50={p50:.0f}us mean={mean:.0f}us p90={p90:.0f}us" for m,(p50,mean,p90) in res.items()))
