#!/usr/bin/python3
"""Hostile messages to every listening socket of a running slicetrain run.

    /usr/bin/python3 bench/hostile.py --pid LAUNCHER_PID [--messages 1000]
        [--token-file PATH] [--seed S] [--timeout 2] [--threads 8] [--idle 8]
        [--idle-wait SECONDS] [--flood N] [--deadline SECONDS] [--json OUT] [--allow-plain]
    /usr/bin/python3 bench/hostile.py --pid LAUNCHER_PID --formation [--messages N]
    /usr/bin/python3 bench/hostile.py --pid LAUNCHER_PID --watch

Finds every listening socket of the launcher and its descendants (the
socket inodes of /proc/PID/fd matched against /proc/net/tcp, tcp6 and unix),
checks that every TCP listener is on a loopback address, and sends each
listener MESSAGES messages, each on a new connection, all listeners at once
(THREADS connections in flight). A message is one of:

  raw        bytes sent before or after reading the server's hello, without
             a proof: random bytes, or a sample of the port's protocol
             (mutated or not) as if no handshake existed;
  token      a correct handshake with the run's token (SLICETRAIN_TOKEN_FILE,
             SLICETRAIN_TOKEN or --token-file), the server's answer checked,
             then a sample of the port's protocol, mutated (a token holder is
             trusted, so samples never name the run's own keys or slots:
             what is checked is that malformed input hurts nothing);
  wrong      a well-formed proof made with another token;
  replay     a proof captured from an earlier correct handshake on that port
             (an eavesdropper's copy), sent to a new hello;
  partial    part of a correct proof, then the end of the stream;
  silent     nothing: read the hello and end the stream.
A listener that does not start with the handshake's hello (a unix socket
that checks the peer's credentials instead) gets the raw messages only.

After sending, the client ends its side (shutdown SHUT_WR) and reads until
the server closes or TIMEOUT passes (then it closes itself). Every socket
operation has a timeout; --deadline bounds the whole barrage. Meanwhile
IDLE connections per listener stay open without a byte sent (a server that
serves one client at a time would wedge on them); with --idle-wait the
servers must drop them (their handshake timeouts) within that many seconds.

--flood N: after the barrage, N silent connections are held on each listener
in turn, and a correct handshake must still get through (a server with a
table of connections must drop an unproven one to make room, not refuse
the newcomer: else anyone who reaches the port locks the run's own
processes out).

--formation: the rendezvous store listens only while a group forms (a few
milliseconds): take its address from the workers' SLICETRAIN_COORDINATOR
(they exist before the store listens), connect until it answers, check
where it is bound, and send it the same mix until MESSAGES or it closes
(best effort: often none reach it, which is not a failure; fuzz_store and
tests/test_auth.c cover the store's parser and limits). --watch: send nothing; until the launcher exits, sample every
listener every 50 ms (the store's too) and check each TCP one is on
loopback and no process of the run has the token on its command line.

The protocols, from the sources: the handshake (comm/auth.h: the server's
36-byte "STA1" hello, the client's 68-byte proof, the server's 32-byte
answer); the controller's line JSON (elastic/proto.h); the store's requests
(comm/store.h: u32 op, key length, value length, key, value); the worker
group's 32-byte frames (comm/comm_int.h, comm/frame.h). A listener's
protocol: the launcher's (the controller), a worker's coordinator port
(SLICETRAIN_COORDINATOR in its environment: the store), a worker's other
TCP and unix listeners (frames); anything else gets all three.

Per listener it reports messages sent by kind and what came of them:
refused (closed without accepting a proof), dropped (the connection closed
after a message behind a correct handshake), answered, held (still open
after TIMEOUT), reset, gone (connect refused: the listener went away). At the
end each listener still listening must complete a correct handshake.

Exit status 1, with the reasons, when: a TCP listener is not on loopback;
a wrong, replayed or partial proof, or no proof, was answered as accepted;
the server's answer to a correct proof was wrong or missing; a TCP listener
does not start with the handshake's hello (unless --allow-plain); a
listener still there does not complete a handshake after the barrage; a
listener went away during it, or the deadline passed before every message
was sent (not with --formation); silent connections outlived --idle-wait; a flood locked a correct handshake
out.
Exit status 2: no such process, or no listener.
"""
import argparse
import hashlib
import hmac
import json
import os
import random
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HELLO, PROOF, MAC = 36, 68, 32
MAGIC = b"STA1"


# ---------------------------------------------------------------- the run's sockets

def proc_stat(pid):
    try:
        s = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    f = s.rsplit(")", 1)[1].split()
    return f[0], int(f[1])  # state, ppid


def descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(d)
            if st:
                kids.setdefault(st[1], []).append(int(d))
    out, stack = [root], [root]
    while stack:
        for k in kids.get(stack.pop(), []):
            out.append(k)
            stack.append(k)
    return out


def fast_descendants(root):
    """The same through /proc/PID/task/TID/children: a few files, not all of /proc."""
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    stack += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def socket_inodes(pid):
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    except OSError:
        pass
    return out


def hex_addr(h, v6):
    if not v6:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(h, 16)))
    raw = bytes.fromhex(h)
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # 4 host-order u32s
    return socket.inet_ntop(socket.AF_INET6, b"".join(words))


def tcp_listeners():
    out = {}
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            lines = open(f"/proc/net/{name}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "0A":  # LISTEN
                continue
            a, p = f[1].split(":")
            out[int(f[9])] = (hex_addr(a, v6), int(p, 16), v6)
    return out


def unix_listeners():
    out = {}
    try:
        lines = open("/proc/net/unix").read().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        f = line.split(None, 7)
        if len(f) < 7 or not int(f[3], 16) & 0x10000:  # __SO_ACCEPTCON: listening
            continue
        kind = {1: socket.SOCK_STREAM, 5: socket.SOCK_SEQPACKET}.get(int(f[4], 16))
        if kind is not None:
            out[int(f[6])] = (f[7] if len(f) > 7 else "", kind)
    return out


def is_loopback(addr):
    if addr.startswith("::ffff:"):
        addr = addr[7:]
    return addr == "::1" or addr.startswith("127.")


def proc_kind(pid):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return "?"
    for w in argv[1:3]:
        if w in (b"launch", b"agent", b"train"):
            return w.decode()
    return os.path.basename(argv[0].decode(errors="replace")) or "?"


def coordinator_port(pid):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for e in env:
        if e.startswith(b"SLICETRAIN_COORDINATOR="):
            try:
                return int(e.rsplit(b":", 1)[1])
            except ValueError:
                return None
    return None


class Listener:
    def __init__(self, name, family, addr, kind, pid, owner, proto):
        self.name, self.family, self.addr, self.kind = name, family, addr, kind
        self.pid, self.owner, self.proto = pid, owner, proto
        self.lock = threading.Lock()
        self.counts = {}       # (category, outcome) -> n
        self.sent = 0
        self.authed = None     # True: it sent the handshake's hello; False: something else
        self.first_bytes = b""
        self.captured = []     # proofs of correct handshakes, for replay
        self.failures = []
        self.gone = 0

    def count(self, cat, outcome):
        with self.lock:
            self.counts[(cat, outcome)] = self.counts.get((cat, outcome), 0) + 1
            self.sent += 1

    def fail(self, why):
        with self.lock:
            if len(self.failures) < 20:
                self.failures.append(why)


def find_listeners(root):
    tcp, unix = tcp_listeners(), unix_listeners()
    found, misplaced = [], []
    for pid in descendants(root):
        kind = proc_kind(pid)
        inodes = socket_inodes(pid)
        coord = coordinator_port(pid) if kind == "train" else None
        for ino in sorted(inodes):
            if ino in tcp:
                addr, port, v6 = tcp[ino]
                if kind == "launch":
                    proto = "controller"
                elif kind == "train":
                    proto = "store" if port == coord else "frames"
                else:
                    proto = "any"
                if not is_loopback(addr):
                    misplaced.append(f"{kind} pid {pid} listens on {addr}:{port}")
                host = "::1" if addr in ("::", "::1") and v6 else ("127.0.0.1" if not is_loopback(addr) else addr)
                fam = socket.AF_INET6 if ":" in host else socket.AF_INET
                found.append(Listener(f"{addr}:{port}", fam, (host, port), socket.SOCK_STREAM, pid, kind,
                                      proto))
            elif ino in unix:
                path, stype = unix[ino]
                # the abstract name's leading NUL is shown as "@" (and so are embedded NULs)
                addr = "\0" + path[1:] if path.startswith("@") else path
                if not path:
                    continue
                found.append(Listener(f"unix:{path}", socket.AF_UNIX, addr, stype, pid, kind,
                                      "frames" if kind == "train" else "any"))
    # one entry per socket (a listener shared by parent and child after fork)
    seen, uniq = set(), []
    for l in found:
        if l.name not in seen:
            seen.add(l.name)
            uniq.append(l)
    return uniq, misplaced


# ---------------------------------------------------------------- the handshake

def key_of(token):
    return hashlib.sha256(token).digest()


def make_proof(key, ns, nc):
    return MAGIC + nc + hmac.new(key, b"c" + ns + nc, hashlib.sha256).digest()


def make_answer(key, ns, nc):
    return hmac.new(key, b"s" + ns + nc, hashlib.sha256).digest()


def load_token(path):
    if path:
        return open(path, "rb").read().strip()
    if os.environ.get("SLICETRAIN_TOKEN_FILE"):
        return open(os.environ["SLICETRAIN_TOKEN_FILE"], "rb").read().strip()
    if os.environ.get("SLICETRAIN_TOKEN"):
        return os.environ["SLICETRAIN_TOKEN"].strip().encode()
    return None


# ---------------------------------------------------------------- valid samples

HOSTILE_KEY = b"hostile/"  # store keys a token holder may touch: never the run's own

def controller_samples():
    hello = {"type": "hello", "version": 1, "slice": 0, "host": 0, "hosts_per_slice": 1, "devices": 1,
             "pid": 1}
    msgs = [hello, dict(hello, slice=1), {"type": "heartbeat"}, {"type": "status"},
            {"type": "started", "gen": 1, "workers": [{"rank": 0, "pid": 2}]},
            {"type": "exit", "gen": 1, "rank": 0, "pid": 2, "status": 0, "signal": 0},
            {"type": "output", "gen": 1, "rank": 0, "stream": "out", "text": "completed step: 1"},
            {"type": "notice", "signal": 15}, {"type": "welcome", "version": 1},
            {"type": "start", "gen": 1, "ranks": [0], "env": {"A": "b"}, "args": ["x.yml"], "threads": 1},
            {"type": "stop", "gen": 1, "how": "resize"}, {"type": "kill", "gen": 1, "rank": 0},
            {"type": "shutdown"}]
    return msgs


def store_request(op, key, val):
    return struct.pack("<III", op, len(key), len(val)) + key + val


def store_samples(rng):
    k = HOSTILE_KEY + str(rng.randrange(1 << 30)).encode()
    return [store_request(1, k, b"value"), store_request(1, k, b"") + store_request(2, k, b""),
            store_request(3, HOSTILE_KEY + b"counter", struct.pack("<q", 1)),
            store_request(1, k, os.urandom(rng.randrange(1, 4096)))]


FRAME_MAGIC = 0x53544331  # "STC1"


def frame(ftype, rank, aux, nonce, key):
    return struct.pack("<IIiIQQ", FRAME_MAGIC, ftype, rank, aux, nonce, key)


def frame_samples(rng):
    nonce = rng.getrandbits(64)  # the group's is secret: a guess
    return [frame(t, rng.randrange(0, 4), rng.randrange(1 << 22), nonce, rng.getrandbits(64))
            for t in (1, 2, 3, 4, 5, 6)]


INTERESTING32 = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x400, 0x401, 0xFFFF, 0x10000, 1 << 26, (1 << 26) + 1,
                 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF]
INTERESTING_JSON = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 2 ** 64, 1e308, -0.0, 0.5,
                    "", "x", "\u0000", "\ud7ff\ue000", "A" * 5000, [], {}, [[[[[]]]]], {"type": "hello"}]


def mutate_bytes(rng, b, others):
    b = bytearray(b)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 8))):
        op = rng.randrange(11)
        n = len(b)
        if op == 0 and n:  # flip a bit
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # a random byte
            b[rng.randrange(n)] = rng.randrange(256)
        elif op == 2:  # insert random bytes
            i = rng.randrange(n + 1)
            b[i:i] = os.urandom(rng.randrange(1, 32))
        elif op == 3 and n:  # delete a range
            i = rng.randrange(n)
            del b[i:i + rng.randrange(1, 16)]
        elif op == 4 and n:  # duplicate a range
            i = rng.randrange(n)
            j = min(n, i + rng.randrange(1, 64))
            b[j:j] = b[i:j] * rng.randrange(1, 8)
        elif op == 5 and n:  # truncate
            del b[rng.randrange(n):]
        elif op == 6 and n >= 4:  # an interesting u32 at an aligned place
            i = rng.randrange(n // 4) * 4
            b[i:i + 4] = struct.pack("<I", rng.choice(INTERESTING32))
        elif op == 7 and others:  # splice with another sample
            o = rng.choice(others)
            i = rng.randrange(n + 1)
            b[i:] = o[rng.randrange(len(o) + 1):]
        elif op == 8:  # the whole thing again
            b = b * rng.randrange(2, 6)
        elif op == 9:  # special bytes
            i = rng.randrange(n + 1)
            b[i:i] = rng.choice((b"\n", b"\0", b"\r\n", b"\xff\xfe", b"\xc0\x80", b"\\", b'"', b"{", b"}"))
        elif op == 10 and rng.random() < 0.2:  # big
            b += bytes([rng.randrange(256)]) * rng.choice((4096, 65535, 65536, 70000, 200000))
    return bytes(b)


def mutate_json(rng, v, depth=0):
    if isinstance(v, dict):
        v = dict(v)
        r = rng.randrange(6)
        if r == 0 and v:
            del v[rng.choice(list(v))]
        elif r == 1:
            v[rng.choice(["type", "slice", "gen", "rank", "pid", "x" * rng.randrange(1, 300), ""])] = \
                rng.choice(INTERESTING_JSON)
        elif r == 2 and v:
            k = rng.choice(list(v))
            v[k] = rng.choice(INTERESTING_JSON) if rng.random() < 0.6 else mutate_json(rng, v[k], depth + 1)
        elif r == 3 and v:
            k = rng.choice(list(v))
            v[k] = mutate_json(rng, v[k], depth + 1)
        elif r == 4:
            v["type"] = rng.choice(["hello", "status", "heartbeat", "exit", "started", "HELLO", "", "x" * 100])
        else:
            for k in list(v)[: rng.randrange(len(v) + 1)]:
                v[k] = rng.choice(INTERESTING_JSON)
        return v
    if isinstance(v, list):
        v = list(v)
        if v and rng.random() < 0.5:
            i = rng.randrange(len(v))
            v[i] = mutate_json(rng, v[i], depth + 1)
        else:
            v.append(rng.choice(INTERESTING_JSON))
        return v
    if isinstance(v, bool) or v is None:
        return rng.choice(INTERESTING_JSON)
    if isinstance(v, int):
        return rng.choice([v + 1, v - 1, -v, v * 1000003, rng.choice(INTERESTING_JSON)])
    if isinstance(v, str):
        return rng.choice([v + v, v[: len(v) // 2], "\n", v + "\u00e9", rng.choice(INTERESTING_JSON)])
    return rng.choice(INTERESTING_JSON)


def controller_message(rng):
    m = rng.choice(controller_samples())
    r = rng.random()
    if r < 0.1:
        return (json.dumps(m) + "\n").encode()
    if r < 0.6:
        m = mutate_json(rng, m)
        line = json.dumps(m).encode() + b"\n"
        return line * rng.choice((1, 1, 1, 2, 3))
    if r < 0.7:  # deep nesting
        d = rng.choice((100, 1000, 5000))
        return b'{"type":"hello","x":' + b"[" * d + b"]" * d + b"}\n"
    lines = [(json.dumps(s) + "\n").encode() for s in controller_samples()]
    return mutate_bytes(rng, rng.choice(lines), lines)


def from_samples(rng, samples, lie, p_lie):
    """A sample as is (10%), a made-up message whose header lies (p_lie), or a mutated sample."""
    r = rng.random()
    if r < 0.1:
        return rng.choice(samples)
    if r < 0.1 + p_lie:
        return lie(rng)
    return mutate_bytes(rng, rng.choice(samples), samples)


def store_lie(rng):
    op = rng.choice((0, 1, 2, 3, 4, 0xFFFFFFFF, rng.getrandbits(32)))
    kl = rng.choice(INTERESTING32 + [rng.randrange(1, 1025)])
    vl = rng.choice(INTERESTING32 + [rng.randrange(0, 5000)])
    body = HOSTILE_KEY + os.urandom(rng.randrange(0, 64))
    return struct.pack("<III", op, kl, vl) + body[: rng.randrange(len(body) + 1)]


def frame_lie(rng):
    return struct.pack("<IIiIQQ", rng.choice((FRAME_MAGIC, rng.getrandbits(32))), rng.randrange(0, 9),
                       rng.choice((-1, 0, 1, 2, 3, 1 << 30, -(1 << 31))), rng.getrandbits(32),
                       rng.getrandbits(64), rng.getrandbits(64))


def store_message(rng):
    return from_samples(rng, store_samples(rng), store_lie, 0.35)


def frames_message(rng):
    return from_samples(rng, frame_samples(rng), frame_lie, 0.3)


def message_for(proto, rng):
    if proto == "any":
        proto = rng.choice(("controller", "store", "frames"))
    return {"controller": controller_message, "store": store_message, "frames": frames_message}[proto](rng)


# ---------------------------------------------------------------- one connection

class Conn:
    def __init__(self, l, timeout):
        self.s = socket.socket(l.family, l.kind)
        self.s.settimeout(timeout)
        self.timeout = timeout
        self.s.connect(l.addr)

    def read(self, n):
        """Up to n bytes (fewer at the end of the stream or after the timeout)."""
        buf = b""
        while len(buf) < n:
            try:
                b = self.s.recv(n - len(buf))
            except socket.timeout:
                break
            if not b:
                break
            buf += b
        return buf

    def send(self, data):
        """False when the server closed (it may drop us while we send)."""
        try:
            if self.s.type == socket.SOCK_SEQPACKET:
                for i in range(0, len(data), 32768):
                    self.s.send(data[i:i + 32768])
            else:
                self.s.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError, socket.timeout, OSError):
            return False

    def finish(self):
        """End our side, then read until the server closes: (extra bytes, outcome)."""
        try:
            self.s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        got, t0 = b"", time.monotonic()
        while time.monotonic() - t0 < self.timeout:
            try:
                b = self.s.recv(65536)
            except socket.timeout:
                return got, "held"
            except ConnectionResetError:
                return got, "reset"
            except OSError:
                return got, "reset"
            if not b:
                return got, "closed"
            if len(got) < 1 << 20:
                got += b
        return got, "held"

    def close(self):
        try:
            # no TIME_WAIT on our side: thousands of connections to one port
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.s.close()


def one(l, cat, rng, key, wrong_key, timeout):
    """Send one message of category cat to l; count what came of it."""
    try:
        c = Conn(l, timeout)
    except (ConnectionRefusedError, FileNotFoundError):
        l.gone += 1
        l.count(cat, "gone")
        return
    except OSError as e:
        l.count(cat, "connect-" + (e.__class__.__name__))
        return
    try:
        payload = message_for(l.proto, rng)
        if not l.authed:
            # a listener without the handshake (a unix socket that checks the
            # peer's credentials instead): all it can get is the message itself
            c.send(payload if rng.random() < 0.7 else os.urandom(rng.randrange(1, 300)))
            _, how = c.finish()
            l.count("plain", how)
            return
        if cat == "raw" and rng.random() < 0.5:
            # blind: before reading the hello
            c.send(payload if rng.random() < 0.7 else os.urandom(rng.randrange(1, 300)))
            expect_refusal(l, c, cat, payload, HELLO)
            return
        hello = c.read(HELLO)
        if hello[:4] != MAGIC or len(hello) != HELLO:
            l.fail(f"{cat}: the hello was {hello[:40]!r}, not \"STA1\" and a nonce")
            l.count(cat, "BAD-HELLO")
            return
        ns = hello[4:]
        if cat == "raw":
            c.send(payload if rng.random() < 0.7 else os.urandom(rng.randrange(1, 300)))
            expect_refusal(l, c, cat, payload)
        elif cat == "silent":
            expect_refusal(l, c, cat, b"")
        elif cat == "partial":
            nc = os.urandom(32)
            p = make_proof(key or b"\0" * 32, ns, nc)
            c.send(p[: rng.randrange(0, PROOF)])
            expect_refusal(l, c, cat, b"")
        elif cat == "wrong":
            nc = os.urandom(32)
            c.send(make_proof(wrong_key, ns, nc) + payload)
            expect_refusal(l, c, cat, payload)
        elif cat == "replay":
            with l.lock:
                captured = rng.choice(l.captured) if l.captured else None
            if captured is None:  # none yet: a proof for a nonce of our own
                captured = make_proof(key or b"\0" * 32, os.urandom(32), os.urandom(32))
            c.send(captured + payload)
            expect_refusal(l, c, cat, payload)
        elif cat == "token":
            nc = os.urandom(32)
            p = make_proof(key, ns, nc)
            if not c.send(p):
                l.count(cat, "reset-in-handshake")
                return
            ans = c.read(MAC)
            if ans != make_answer(key, ns, nc):
                if not ans and connect_ok(l, timeout) is None:
                    l.count(cat, "closed-while-stopping")  # the listener closed meanwhile (the store's end)
                elif len(ans) < MAC:
                    l.fail(f"token: a correct proof got {len(ans)} bytes of answer, not {MAC}")
                    l.count(cat, "HANDSHAKE-REFUSED")
                else:
                    l.fail("token: the server's answer to a correct proof is wrong")
                    l.count(cat, "BAD-SERVER-ANSWER")
                return
            with l.lock:
                if len(l.captured) < 16:
                    l.captured.append(p)
            ok = c.send(payload)
            got, how = c.finish()
            if not ok:
                how = "dropped"
            l.count(cat, "answered" if got else ("dropped" if how in ("closed", "reset", "dropped") else how))
    except OSError as e:
        l.count(cat, "error-" + e.__class__.__name__)
    finally:
        c.close()


def probe(l, timeout):
    """Does l start with the handshake's hello? (authed: True, False; None: gone)"""
    try:
        c = Conn(l, min(timeout, 0.5))
    except OSError:
        return
    try:
        hello = c.read(HELLO)
        l.authed = hello[:4] == MAGIC and len(hello) == HELLO
        l.first_bytes = hello[:16]
    finally:
        c.close()


def connect_ok(l, timeout):
    try:
        Conn(l, timeout).close()
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return None
    except OSError:
        return False


def expect_refusal(l, c, cat, payload, hello=0):
    """End our side; the server must close without a byte after its hello
    (hello: its length when it is still unread)."""
    got, how = c.finish()
    got = got[hello:]
    if got:
        l.fail(f"{cat}: the server sent {len(got)} bytes after its hello without a correct proof "
               f"({got[:40]!r}); sent {payload[:60]!r}")
        l.count(cat, "ACCEPTED")
    else:
        l.count(cat, "refused" if how in ("closed", "reset") else how)


def handshake_ok(l, key, timeout):
    try:
        c = Conn(l, timeout)
    except OSError:
        return None  # gone
    try:
        hello = c.read(HELLO)
        if hello[:4] != MAGIC or len(hello) < HELLO:
            return False
        nc = os.urandom(32)
        if not c.send(make_proof(key or b"\0" * 32, hello[4:], nc)):
            return False
        return c.read(MAC) == make_answer(key or b"\0" * 32, hello[4:], nc)
    except OSError:
        return False
    finally:
        c.close()


# ---------------------------------------------------------------- main

def watch(root, token, interval):
    """Until root exits: every listener of the run (the store's too, which
    lives only while a group forms) must be on loopback, and no command
    line may hold the token. Returns the failures."""
    seen, failures = {}, []
    while (proc_stat(root) or ("Z",))[0] != "Z":
        try:
            listeners, misplaced = find_listeners(root)
        except OSError:
            continue
        for l in listeners:
            seen.setdefault(l.name, (l.owner, l.proto))
        for m in misplaced:
            if f"not on loopback: {m}" not in failures:
                failures.append(f"not on loopback: {m}")
        if token:
            for pid in descendants(root):
                try:
                    if token in open(f"/proc/{pid}/cmdline", "rb").read():
                        failures.append(f"the token is on the command line of pid {pid}")
                except OSError:
                    pass
        time.sleep(interval)
    kinds = {}
    for owner, proto in seen.values():
        kinds[f"{owner}/{proto}"] = kinds.get(f"{owner}/{proto}", 0) + 1
    print(f"hostile --watch: {len(seen)} listener(s) seen over the run (" +
          ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + "); " +
          ("every TCP one on loopback" if not failures else f"{len(failures)} failure(s)"))
    for f in sorted(set(failures)):
        print(f"hostile --watch: FAIL: {f}")
    return failures


CATEGORIES = (("raw", 30), ("token", 35), ("wrong", 12), ("replay", 12), ("partial", 6), ("silent", 5))


def barrage(listeners, a, key, wrong_key):
    """a.messages messages to each listener, all at once; the seconds it took."""
    t0 = time.monotonic()
    cats = [c for c, w in CATEGORIES for _ in range(w)]
    stop = threading.Event()

    def task(li, i):
        if stop.is_set() or time.monotonic() - t0 > a.deadline:
            stop.set()
            return
        l = listeners[li]
        if l.gone >= 3:  # the listener went away (its process ended): count the rest as gone
            l.count("-", "gone")
            return
        rng = random.Random((a.seed << 40) ^ (li << 24) ^ i)
        cat = rng.choice(cats) if (key or rng.random() < 0.5) else rng.choice(("raw", "wrong", "silent"))
        one(l, cat, rng, key or b"\0" * 32, wrong_key, a.timeout)

    with ThreadPoolExecutor(max_workers=a.threads) as ex:
        for i in range(a.messages):
            for li in range(len(listeners)):
                ex.submit(task, li, i)
    return time.monotonic() - t0


def drain_idle(idle, wait):
    """Wait up to wait seconds for the servers to drop the silent connections
    (their handshake timeouts): (closed, seconds to the last, still open)."""
    open_idle = {id(c): (l, c) for l, c in idle}
    for l, c in idle:
        c.s.setblocking(False)
    closed, t1, last = 0, time.monotonic(), 0.0
    while True:
        for k, (l, c) in list(open_idle.items()):
            try:
                while True:
                    b = c.s.recv(1 << 16)  # the hello, then the end
                    if not b:
                        raise ConnectionResetError
            except BlockingIOError:
                continue
            except OSError:
                closed, last = closed + 1, time.monotonic() - t1
                c.close()
                del open_idle[k]
        if not open_idle or time.monotonic() - t1 >= wait:
            break
        time.sleep(0.1)
    for l, c in open_idle.values():
        c.close()
    return closed, last, sorted({l.name for l, _ in open_idle.values()})


def summarize(listeners, a, key, formation):
    """Print a listener's counts; its failures, and its report entry."""
    failures, entries = [], []
    for l in listeners:
        alive = handshake_ok(l, key, a.timeout) if l.authed else connect_ok(l, a.timeout)
        by_outcome, by_cat = {}, {}
        for (cat, out), n in l.counts.items():
            by_outcome[out] = by_outcome.get(out, 0) + n
            by_cat[cat] = by_cat.get(cat, 0) + n
        gone = by_outcome.get("gone", 0)
        after = ("gone" if alive is None else
                 ("handshake ok" if l.authed else "accepts") if alive else
                 "NO HANDSHAKE" if l.authed else "REFUSES")
        print(f"  {l.name:40s} {l.proto:10s} sent {l.sent - gone:6d}: " +
              ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items()) if k != "gone") +
              f"; afterwards: {after}")
        print(f"  {'':40s} {'':10s} by kind: " +
              ", ".join(f"{k} {v}" for k, v in sorted(by_cat.items()) if k != "-"))
        if l.authed is False and l.family != socket.AF_UNIX and not a.allow_plain:
            failures.append(f"{l.name}: no handshake (first bytes {l.first_bytes!r}, not \"STA1\" + nonce)")
        if alive is False:
            failures.append(f"{l.name}: still listening, but " +
                            ("a correct handshake fails" if l.authed else "refuses connections") +
                            " after the barrage")
        if gone and not formation:
            failures.append(f"{l.name}: {gone} messages found it gone (its process ended before the barrage did)")
        if l.sent < a.messages and not formation:
            failures.append(f"{l.name}: {l.sent} of {a.messages} messages sent (the deadline passed)")
        failures += [f"{l.name}: {f}" for f in l.failures]
        entries.append({"listener": l.name, "owner": l.owner, "pid": l.pid, "protocol": l.proto,
                        "handshake": l.authed, "sent": l.sent - gone, "outcomes": by_outcome, "kinds": by_cat,
                        "afterwards": after, "failures": l.failures})
    return failures, entries


def flood(listeners, n, key, timeout):
    """With n silent connections held on a listener, a correct handshake
    (a plain listener: a connection) must still get through: a server with a
    fixed table of connections must make room (drop the oldest that has not
    proved the token) rather than refuse newcomers. The failures."""
    failures = []
    for l in listeners:
        held = []
        for _ in range(n):
            try:
                held.append(Conn(l, timeout))
            except OSError:
                break
        time.sleep(0.2)  # the server accepts them all
        ok = handshake_ok(l, key, timeout) if l.authed else connect_ok(l, timeout)
        for c in held:
            c.close()
        print(f"  {l.name:40s} {len(held)} silent connections held: a "
              f"{'correct handshake' if l.authed else 'connection'} {'still gets through' if ok else 'FAILS'}")
        if ok is False:
            failures.append(f"{l.name}: with {len(held)} silent connections held, " +
                            ("a correct handshake fails" if l.authed else "a connection is refused"))
    return failures


def workers_of_run(root):
    """{pid: (rank, (host, port) of SLICETRAIN_COORDINATOR)} of the run's workers."""
    out = {}
    for pid in fast_descendants(root):
        if proc_kind(pid) != "train":
            continue
        try:
            env = dict(e.split(b"=", 1) for e in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        host, _, port = env.get(b"SLICETRAIN_COORDINATOR", b"").decode(errors="replace").rpartition(":")
        if port.isdigit() and env.get(b"SLICETRAIN_RANK", b"").isdigit():
            out[pid] = (int(env[b"SLICETRAIN_RANK"]), (host.strip("[]"), int(port)))
    return out


def formation(a, key, wrong_key):
    """The store listens only while a group forms, a few milliseconds: learn
    its address from the workers' environment (they exist before the store
    listens), connect until it answers, then send it messages until
    a.messages or it closes. Best effort: the store often closes before the
    first message (or is never caught), which is not a failure; what it
    answers, and where it is bound, are checked. (Stopping a worker to hold
    the group open would be surer, but one stopped after it joined fails the
    generation.) Exit status as main's."""
    t0, coord, up = time.monotonic(), None, False
    alive = lambda: (proc_stat(a.pid) or ("Z",))[0] != "Z" and time.monotonic() - t0 < a.deadline
    while alive() and not up:
        for pid, (rank, c) in workers_of_run(a.pid).items():
            coord = coord or c
        if not coord:
            time.sleep(0.002)
            continue
        try:
            with socket.create_connection(coord, timeout=0.5):
                up = True
        except OSError:
            time.sleep(0.001)
    if not up:
        print("hostile --formation: " + ("no worker with SLICETRAIN_COORDINATOR seen" if not coord else
                                         f"the store at {coord[0]}:{coord[1]} was not caught listening") +
              " (best effort: not a failure)")
        return 0
    host, port = coord
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    store = Listener(f"{host}:{port}", fam, (host, port), socket.SOCK_STREAM, a.pid, "train", "store")
    bound = [addr for addr, p, _ in tcp_listeners().values() if p == port]
    failures = [f"the store listens on {addr}:{port}, not loopback" for addr in bound if not is_loopback(addr)]
    probe(store, a.timeout)
    seconds = barrage([store], a, key, wrong_key)
    print(f"hostile --formation: the store {host}:{port} (bound to {', '.join(bound) or '?'}): messages until "
          f"{a.messages} or it closed, {seconds:.1f} s")
    found, entries = summarize([store], a, key, True)
    failures += found
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"pid": a.pid, "formation": entries, "failures": failures}, f, indent=1)
    for why in failures:
        print(f"hostile --formation: FAIL: {why}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pid", type=int, required=True, help="the launcher's pid")
    ap.add_argument("--messages", type=int, default=1000, help="messages per listener")
    ap.add_argument("--token-file", help="the run's token (default SLICETRAIN_TOKEN_FILE / SLICETRAIN_TOKEN)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds per socket operation")
    ap.add_argument("--threads", type=int, default=8, help="connections in flight")
    ap.add_argument("--idle", type=int, default=8, help="silent connections held open per listener")
    ap.add_argument("--idle-wait", type=float, default=0.0,
                    help="after the barrage, wait up to this long for the servers to drop the silent "
                         "connections (a failure if they do not)")
    ap.add_argument("--deadline", type=float, default=600.0, help="seconds for the whole barrage")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--allow-plain", action="store_true",
                    help="a listener without the handshake is reported, not a failure")
    ap.add_argument("--no-unix", action="store_true", help="TCP listeners only")
    ap.add_argument("--watch", action="store_true",
                    help="send nothing: until the launcher exits, check every listener (the store's too) "
                         "is on loopback and no command line holds the token")
    ap.add_argument("--flood", type=int, default=0,
                    help="after the barrage, hold this many silent connections on each listener in turn: a "
                         "correct handshake must still get through")
    ap.add_argument("--formation", action="store_true",
                    help="wait for the store (it listens only while a group forms) and send it messages "
                         "until it closes")
    a = ap.parse_args()

    if proc_stat(a.pid) is None:
        print(f"hostile: no process {a.pid}", file=sys.stderr)
        return 2
    token = load_token(a.token_file)
    key = key_of(token) if token else None
    if a.watch:
        return 1 if watch(a.pid, token, 0.05) else 0
    wrong_key = key_of(b"not-the-run-token-" + os.urandom(8).hex().encode())
    if a.formation:
        return formation(a, key, wrong_key)
    listeners, misplaced = find_listeners(a.pid)
    if a.no_unix:
        listeners = [l for l in listeners if l.family != socket.AF_UNIX]
    if not listeners:
        print(f"hostile: no listening socket under pid {a.pid}", file=sys.stderr)
        return 2
    print(f"hostile: {len(listeners)} listener(s) under pid {a.pid}; token "
          f"{'loaded' if key else 'none (correct handshakes use a key of zeros)'}")
    failures = [f"not on loopback: {m}" for m in misplaced]
    for l in listeners:
        probe(l, a.timeout)
        print(f"  {l.name:40s} {l.owner} pid {l.pid}, protocol {l.proto}, " +
              ("gone" if l.authed is None else "handshake" if l.authed else
               f"no handshake (first bytes {l.first_bytes!r})"))

    # silent connections held through the barrage
    idle = []
    for l in listeners:
        for _ in range(a.idle):
            try:
                idle.append((l, Conn(l, a.timeout)))
            except OSError:
                break

    elapsed = barrage(listeners, a, key, wrong_key)
    idle_closed, last, still = drain_idle(idle, a.idle_wait)
    if a.idle_wait and still:
        failures.append(f"silent connections still open {a.idle_wait:.0f} s after the barrage: " + ", ".join(still))
    print(f"hostile: {elapsed:.1f} s; {len(idle)} silent connections held meanwhile, {idle_closed} of them "
          f"closed by the server" + (f" (the last {last:.1f} s after the barrage)" if idle_closed else ""))
    found, entries = summarize(listeners, a, key, False)
    failures += found
    if a.flood:
        print(f"hostile: flood ({a.flood} silent connections per listener):")
        failures += flood(listeners, a.flood, key, a.timeout)
    report = {"pid": a.pid, "seconds": round(elapsed, 1), "messages_per_listener": a.messages,
              "idle_held": len(idle), "idle_closed_by_server": idle_closed, "listeners": entries,
              "failures": failures}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    for why in failures:
        print(f"hostile: FAIL: {why}")
    print(f"hostile: {'ok' if not failures else f'{len(failures)} failure(s)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
