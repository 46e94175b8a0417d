#!/usr/bin/env python3
"""netns_forward.py LISTEN_PORT NETNS_FILE TARGET_PORT

The local cluster's `kubectl port-forward`: listens on 127.0.0.1:LISTEN_PORT
in this network namespace, and connects each client to 127.0.0.1:TARGET_PORT
inside the network namespace NETNS_FILE (/proc/PID/ns/net of a process in
it), where the local Ray cluster lives (deploy/ray/local-cluster.sh).

How: the listening socket is made first, in our own namespace; then this
process enters the cluster's namespace (setns), so the sockets it makes from
then on (the connections to the target) are in there, while the listener
stays where it was made. Bytes are copied both ways by two threads per
connection; a connection ends when either side closes. Needs CAP_SYS_ADMIN
(root), like `nsenter`. Prints "forwarding" once it listens.
"""
import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000


def pipe(src, dst):
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            dst.sendall(b)
    except OSError:
        pass
    finally:
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client, target_port):
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port), timeout=10)
        upstream.settimeout(None)
    except OSError:
        client.close()
        return
    a = threading.Thread(target=pipe, args=(client, upstream), daemon=True)
    b = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
    a.start()
    b.start()
    a.join()
    b.join()
    client.close()
    upstream.close()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[0])
    listen_port, netns, target_port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        lsock.bind(("127.0.0.1", listen_port))
    except OSError as e:
        sys.exit(f"netns_forward: cannot listen on 127.0.0.1:{listen_port}: {e.strerror}")
    lsock.listen(64)
    fd = os.open(netns, os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        sys.exit(f"netns_forward: setns({netns}): {os.strerror(ctypes.get_errno())}")
    os.close(fd)
    print("forwarding", flush=True)
    while True:
        client, _ = lsock.accept()
        threading.Thread(target=serve, args=(client, target_port), daemon=True).start()


if __name__ == "__main__":
    main()
