#!/usr/bin/env python3
"""handshake_probe.py HOST:PORT KIND...

Plays a client of slicetrain's run-token handshake (src/comm/auth.h) against
a listening port of a running group and prints one line per KIND:
  notoken  the proof of a client without a token (HMAC under a key of zeros)
  wrong    the proof of a client with another token
  right    the proof of the run's own token (SLICETRAIN_TOKEN_FILE): the
           listener must answer with its own proof, which is checked; then
           the probe closes (a control: the probe speaks the handshake right)
Exit status 0 when every KIND got what it must: notoken and wrong refused
(the listener closes without its 32-byte answer), right answered correctly.
"""
import hashlib
import hmac
import os
import socket
import sys

MAGIC = b"STA1"


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        try:
            x = s.recv(n - len(b))
        except (ConnectionResetError, TimeoutError, socket.timeout):
            break
        if not x:
            break
        b += x
    return b


def probe(host, port, key):
    """'refused' | 'answered' | 'bad answer' | 'no hello'"""
    with socket.create_connection((host, port), timeout=10) as s:
        hello = recv_exact(s, 36)
        if len(hello) != 36 or hello[:4] != MAGIC:
            return "no hello"
        ns, nc = hello[4:], os.urandom(32)
        s.sendall(MAGIC + nc + hmac.new(key, b"c" + ns + nc, hashlib.sha256).digest())
        ans = recv_exact(s, 32)
        if len(ans) < 32:
            return "refused"
        want = hmac.new(key, b"s" + ns + nc, hashlib.sha256).digest()
        return "answered" if hmac.compare_digest(ans, want) else "bad answer"


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    host, port = host.strip("[]"), int(port)
    ok = True
    for kind in sys.argv[2:]:
        if kind == "notoken":
            key, want = bytes(32), "refused"
        elif kind == "wrong":
            key, want = hashlib.sha256(b"not-the-run-token-" + os.urandom(8).hex().encode()).digest(), "refused"
        elif kind == "right":
            with open(os.environ["SLICETRAIN_TOKEN_FILE"], "rb") as f:
                key, want = hashlib.sha256(f.read().strip()).digest(), "answered"
        else:
            sys.exit(f"unknown kind {kind}")
        got = probe(host, port, key)
        print(f"{sys.argv[1]} {kind}: {got}" + ("" if got == want else f" (want {want})"))
        ok &= got == want
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
