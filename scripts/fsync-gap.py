#!/usr/bin/env python3
# fdatasync latency inside a posix_fallocate'd file as a function of the pause between syncs:
# a tight loop (the floor's `peerbench fsync`) against syncs spaced as a request chain spaces
# them (a round trip and the processing between one sync and the next). The pause sleeps, as a
# server thread waiting for its next request does. Gaps are interleaved within each round.
# usage: scripts/fsync-gap.py [COUNT] [ROUNDS] (writes in the current directory)
import os, time, statistics, sys
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
GAPS_US = [0, 50, 100, 150, 200, 300, 400]
rec = b'x' * 200
def run(gap_us):
    path = 'fsync-gap.bin'
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o644)
    os.posix_fallocate(fd, 0, N * len(rec) + 4096); os.fsync(fd)
    lat = []
    for i in range(N):
        if gap_us:
            time.sleep(gap_us / 1e6)
        t = time.perf_counter_ns()
        os.pwrite(fd, rec, i * len(rec)); os.fdatasync(fd)
        lat.append((time.perf_counter_ns() - t) / 1000)
    os.close(fd); os.unlink(path)
    return statistics.median(lat), statistics.mean(lat)
for r in range(ROUNDS):
    for gap in GAPS_US:
        p50, mean = run(gap)
        print(f"round={r} gap_us={gap} write_sync_p50_us={p50:.0f} mean_us={mean:.0f}", flush=True)
