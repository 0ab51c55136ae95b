#!/usr/bin/env python3
"""Keep a VM guest's free memory backed by the host while a benchmark runs (issue 16).

Some VM kernels hand free memory back to the host (free page reporting, `virtio_balloon`;
`/sys/module/page_reporting/parameters/`). A page handed back costs the guest a fault into the
host the next time it is touched. Every byte a broker appends lands in a fresh page-cache page,
and a benchmark that drops the page cache before each run (as `compare.sh` does, so that one
broker does not pay for reclaiming the other's cache) hands those pages back just before they
are needed again. On the 2-core VM of bench/README.md, touching fresh memory cost 2.50–2.70 s
per GiB with reporting on and 0.39–0.40 s/GiB once the memory had been touched and kept;
kaas's acks=1 produce measured 2.50 broker CPU s/GiB with reporting on and 1.30 with it off.
That cost is the host's, not the broker's, and it lands on whichever broker writes into the
memory first.

    host_memory.py hold      # stop reporting, touch the free memory once; prints what it did
    host_memory.py release   # restore the reporting order `hold` saved
    host_memory.py status    # the order now, and how much has been reported since boot

`hold` sets `page_reporting_order` above the largest buddy order (so no free block qualifies)
and saves the previous value in a state file; a second `hold` keeps the first saved value.
`release` restores it and removes the file. Needs root. On a machine without free page
reporting `hold` says so and changes nothing (exit status 0), so scripts can call it anywhere.
"""

import argparse
import mmap
import os
import sys

KNOB_DIR = "/sys/module/page_reporting/parameters"
ORDER = os.path.join(KNOB_DIR, "page_reporting_order")
REPORTED = os.path.join(KNOB_DIR, "reported_kib")  # present on some kernels only
DEFAULT_STATE = "/tmp/kaas-bench-page-reporting-order"
# Left untouched by `hold`, so the touch never presses the machine into reclaiming much.
MARGIN_BYTES = 1 << 30
CHUNK_BYTES = 256 << 20


def max_buddy_order() -> int:
    """The largest order the page allocator keeps free blocks of: /proc/buddyinfo has one
    column per order, 0 to the largest."""
    with open("/proc/buddyinfo") as f:
        line = f.readline()
    # "Node 0, zone      DMA      1 0 ..." : the counts follow the zone name.
    return len(line.split()[4:]) - 1


def mem_free_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemFree:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemFree")


def touch_free_memory(limit_bytes: int | None = None) -> int:
    """Faults in (MAP_POPULATE) anonymous memory up to MemFree minus a margin, then lets it
    go: every page touched is backed by the host again, and with reporting off it stays so
    once freed. Returns the bytes touched."""
    want = max(0, mem_free_bytes() - MARGIN_BYTES)
    if limit_bytes is not None:
        want = min(want, limit_bytes)
    maps, touched = [], 0
    try:
        while touched < want:
            size = min(CHUNK_BYTES, want - touched)
            maps.append(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                  | mmap.MAP_POPULATE))
            touched += size
    finally:
        for m in maps:
            m.close()
    return touched


def hold(state: str, touch_limit: int | None) -> None:
    if not os.path.exists(ORDER):
        print(f"host_memory: no free page reporting here ({KNOB_DIR} absent): nothing to hold")
        return
    if not os.access(ORDER, os.W_OK):
        sys.exit(f"host_memory: {ORDER} is not writable: run as root")
    current = open(ORDER).read().strip()
    off = str(max_buddy_order() + 1)
    if not os.path.exists(state):
        with open(state, "w") as f:
            f.write(current)
    with open(ORDER, "w") as f:
        f.write(off)
    touched = touch_free_memory(touch_limit)
    print(f"host_memory: free page reporting off (page_reporting_order {current} -> {off}, "
          f"saved in {state}); touched {touched / 2**30:.1f} GiB of free memory")


def release(state: str) -> None:
    if not os.path.exists(state):
        print("host_memory: nothing held (no state file)")
        return
    saved = open(state).read().strip()
    with open(ORDER, "w") as f:
        f.write(saved)
    os.remove(state)
    print(f"host_memory: free page reporting restored (page_reporting_order {saved})")


def status() -> None:
    if not os.path.exists(ORDER):
        print("host_memory: no free page reporting here")
        return
    order = open(ORDER).read().strip()
    reported = open(REPORTED).read().strip() if os.path.exists(REPORTED) else "unknown"
    state = "off" if int(order) > max_buddy_order() else "on"
    print(f"host_memory: reporting {state} (page_reporting_order {order}); "
          f"reported since boot: {reported} KiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["hold", "release", "status"])
    ap.add_argument("--state", default=DEFAULT_STATE, help="where hold saves the order")
    ap.add_argument("--touch-mib", type=int, default=None,
                    help="touch at most this much (default: MemFree minus 1 GiB)")
    a = ap.parse_args()
    if a.action == "hold":
        hold(a.state, None if a.touch_mib is None else a.touch_mib << 20)
    elif a.action == "release":
        release(a.state)
    else:
        status()


if __name__ == "__main__":
    main()
