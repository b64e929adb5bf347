"""The child that answers for a replay probe while its process restores a checkpoint
(restore_watch.py says why). Run by path with `python -I -S`: it imports nothing but the
standard library's smallest modules, not even replaywatch, so that it serves within
milliseconds of CPU on a host the load keeps busy. Everything it says comes from its parent
on stdin's first line: the document, the keys to refresh in it, the parent's pid and its
reads when the load began. It answers `GET /probe` (and says why there are no stacks) on the
listening socket it was handed, keeping connections open as the probe does, and exits when
stdin closes: the load ended, or the parent died.

    python -I -S restore_child.py FD
"""

import json
import os
import socket
import sys
import threading
import time


def _rss(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def _rchar(pid):
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "rchar":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def _live(cfg):
    keys, pid, doc = cfg["keys"], cfg["pid"], dict(cfg["doc"])
    doc[keys["now"]] = time.time()
    doc[keys["rss"]] = _rss(pid)
    restore = dict(doc.get(keys["restore"]) or {})
    if restore:
        now, base = _rchar(pid), cfg["baseline"]
        restore[keys["read"]] = None if now is None or base is None else now - base
        doc[keys["restore"]] = restore
    return doc


def _answer(conn, cfg):
    conn.settimeout(5.0)
    reader = conn.makefile("rb")
    try:
        while True:
            line = reader.readline(8192)
            if not line.strip():
                return
            while reader.readline(8192) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.split()
            path = parts[1].split(b"?")[0] if len(parts) > 1 else b""
            if path == b"/probe":
                status, body = "200 OK", _live(cfg)
            elif path == b"/stacks":
                status, body = "503 Service Unavailable", {"error": cfg["stacks_error"]}
            else:
                status, body = "404 Not Found", {"error": "not found"}
            data = json.dumps(body).encode()
            conn.sendall((f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    except OSError:
        return
    finally:
        conn.close()


def main():
    sock = socket.socket(fileno=int(sys.argv[1]))
    cfg = json.loads(sys.stdin.readline())
    sock.settimeout(0.2)
    done = threading.Event()
    def wait_for_eof():
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    # The parent loads once told this: the load is timed and counted from here, as the
    # parent's own record is.
    cfg["baseline"] = _rchar(cfg["pid"])
    restore = cfg["doc"].get(cfg["keys"]["restore"])
    if restore:
        restore[cfg["keys"]["started_at"]] = time.time()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while not done.is_set():
        try:
            conn, _ = sock.accept()
        except (TimeoutError, BlockingIOError, InterruptedError):
            continue
        except OSError:
            return
        threading.Thread(target=_answer, args=(conn, cfg), daemon=True).start()


if __name__ == "__main__":
    main()
