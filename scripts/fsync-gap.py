#!/usr/bin/env python3
# Time of a 200-byte pwrite plus fdatasync inside a posix_fallocate'd file, as a function of the pause between syncs:
# a tight loop (the floor's `peerbench fsync`) against syncs spaced as a request chain spaces
# them (a round trip and the processing between one sync and the next). The pause sleeps, as a
# server thread waiting for its next request does. Python's sleep overshoots short pauses, so
# the pause actually taken (from the end of one sync to the next write) is measured and
# reported beside the one asked for. Each round runs every pause in turn, as a block of COUNT
# syncs, in the order of PAUSES_US.
# usage: scripts/fsync-gap.py [COUNT] [ROUNDS] (writes in the current directory)
import os, time, statistics, sys
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
PAUSES_US = [0, 20, 50, 100, 150, 200, 300, 400]
rec = b'x' * 200
def run(pause_us):
    path = 'fsync-gap.bin'
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o644)
    os.posix_fallocate(fd, 0, N * len(rec) + 4096); os.fsync(fd)
    lat, taken = [], []
    synced = time.perf_counter_ns()
    for i in range(N):
        if pause_us:
            time.sleep(pause_us / 1e6)
        t = time.perf_counter_ns()
        taken.append((t - synced) / 1000)
        os.pwrite(fd, rec, i * len(rec)); os.fdatasync(fd)
        synced = time.perf_counter_ns()
        lat.append((synced - t) / 1000)
    os.close(fd); os.unlink(path)
    return statistics.median(taken), statistics.median(lat), statistics.mean(lat)
for r in range(ROUNDS):
    for pause in PAUSES_US:
        taken, p50, mean = run(pause)
        print(f"round={r} pause_asked_us={pause} pause_taken_p50_us={taken:.0f} "
              f"write_sync_p50_us={p50:.0f} mean_us={mean:.0f}", flush=True)
