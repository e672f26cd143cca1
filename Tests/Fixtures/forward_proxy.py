#!/usr/bin/env python3
"""A small forward proxy for bearerd's outbound_proxy tests: CONNECT tunnels (RFC 9110 §9.3.6)
and absolute-form HTTP requests (RFC 9112 §3.2.2), with optional Basic credentials
(--user user:password; a request without them gets 407).

Every request head it receives is appended as one JSON line to --log:
  {"method": "CONNECT", "target": "127.0.0.1:443", "authorized": true}
and, when a CONNECT ends, how many bytes went through the tunnel towards the target (0 when the
client closed before or right after the answer, without using the tunnel):
  {"tunnel": "127.0.0.1:443", "bytes_to_target": 517, "answered": true}

--mode changes the answer to CONNECT (absolute-form requests are always forwarded):
  ok       200 and a tunnel (the default)
  407      407 Proxy Authentication Required, whatever the credentials
  403      403 Forbidden (a proxy policy refusing the target)
  silent   read the CONNECT and never answer (until the client closes)
  delay    wait --delay seconds, then as `ok` (the answer comes late)
Prints `READY <port>` when listening; exits when stdin closes.
"""
import argparse
import base64
import json
import socket
import sys
import threading
import time
from urllib.parse import urlsplit


def read_head(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(1)
        if not chunk:
            return None, b""
        data += chunk
        if len(data) > 65536:
            return None, b""
    head, _, rest = data.partition(b"\r\n\r\n")
    return head.decode("latin-1"), rest


def pipe(a, b, counter=None):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            if counter is not None:
                counter[0] += len(data)
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def log_line(args, log_lock, record):
    with log_lock, open(args.log, "a") as f:
        f.write(json.dumps(record) + "\n")


def serve_client(conn, args, log_lock):
    with conn:
        head, rest = read_head(conn)
        if head is None:
            return
        lines = head.split("\r\n")
        method, target, _ = (lines[0].split(" ") + ["", ""])[:3]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        authorized = True
        if args.user:
            expected = "Basic " + base64.b64encode(args.user.encode()).decode()
            authorized = headers.get("proxy-authorization") == expected
        log_line(args, log_lock, {"method": method, "target": target, "authorized": authorized})
        if not authorized or (method == "CONNECT" and args.mode == "407"):
            conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        if method == "CONNECT":
            if args.mode == "403":
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 9\r\nConnection: close\r\n\r\nforbidden")
                return
            if args.mode == "silent":
                # Never answer: hold the connection until the client gives up.
                while conn.recv(65536):
                    pass
                log_line(args, log_lock, {"tunnel": target, "bytes_to_target": 0, "answered": False})
                return
            if args.mode == "delay":
                time.sleep(args.delay)
            host, _, port = target.rpartition(":")
            try:
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            except OSError:
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            try:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            except OSError:
                pass  # the client is gone; the tunnel carries nothing (logged below)
            counter = [len(rest)]
            if rest:
                upstream.sendall(rest)
            t = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
            t.start()
            pipe(conn, upstream, counter)
            t.join()
            upstream.close()
            log_line(args, log_lock, {"tunnel": target, "bytes_to_target": counter[0], "answered": True})
            return
        # Absolute form: forward with an origin-form target, one request per connection.
        url = urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        out = ["%s %s HTTP/1.1" % (method, path)]
        for line in lines[1:]:
            name = line.split(":", 1)[0].strip().lower()
            if name in ("proxy-authorization", "proxy-connection", "connection", "keep-alive"):
                continue
            out.append(line)
        out.append("Connection: close")
        upstream = socket.create_connection((url.hostname, url.port or 80), timeout=10)
        upstream.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + rest)
        t = threading.Thread(target=pipe, args=(conn, upstream), daemon=True)
        t.start()
        pipe(upstream, conn)
        upstream.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--log", required=True)
    p.add_argument("--user", default=None, help="user:password the proxy requires")
    p.add_argument("--mode", default="ok", choices=["ok", "407", "403", "silent", "delay"])
    p.add_argument("--delay", type=float, default=1.0, help="seconds before answering CONNECT in --mode delay")
    args = p.parse_args()
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", args.port))
    srv.listen(64)
    print("READY %d" % srv.getsockname()[1], flush=True)
    log_lock = threading.Lock()

    def accept_loop():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve_client, args=(conn, args, log_lock), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    sys.stdin.read()


if __name__ == "__main__":
    main()
