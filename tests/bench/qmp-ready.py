#!/usr/bin/env python3
"""Wait until every QMP socket named answers `query-status`.

    qmp-ready.py T0 TIMEOUT_S SOCKET...

T0 is the start, in seconds since the epoch (bash's $EPOCHREALTIME taken
just before the first launch). Polls every pending socket every 10 ms (a
socket that does not exist yet, or refuses, is tried again), and prints
`READY ms=<T0 to the last answer> last=<that socket>` once all answered,
or `NOT-READY n=<pending> first=<one of them>` and exits 1 after
TIMEOUT_S. One process for all of them: the poller's own cost does not
grow with a process per VM.
"""
import json
import socket
import sys
import time


def answers(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(path)
        f = s.makefile("rwb")
        json.loads(f.readline())  # the greeting
        for cmd in ("qmp_capabilities", "query-status"):
            f.write(json.dumps({"execute": cmd}).encode() + b"\n")
            f.flush()
            while True:
                r = json.loads(f.readline())
                if "return" in r or "error" in r:
                    break
        return "return" in r
    except (OSError, ValueError):
        return False
    finally:
        s.close()


def main():
    t0 = float(sys.argv[1])
    limit = float(sys.argv[2])
    pending = list(sys.argv[3:])
    last, at = None, t0
    while pending:
        if time.time() - t0 > limit:
            print(f"NOT-READY n={len(pending)} first={pending[0]}")
            sys.exit(1)
        still = []
        for p in pending:
            if answers(p):
                last, at = p, time.time()
            else:
                still.append(p)
        pending = still
        if pending:
            time.sleep(0.01)
    print(f"READY ms={(at - t0) * 1000:.0f} last={last}")


if __name__ == "__main__":
    main()
