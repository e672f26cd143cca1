#!/usr/bin/env python3
"""An HTTP/2 client with prior knowledge (RFC 9113 §3.3) that opens several streams at once on
one connection, for bearerd's end-to-end tests (curl 7.88's --parallel with
--http2-prior-knowledge fails with framing errors even against other servers). TEST FIXTURE ONLY.

    python3 h2c_client.py --port P --path /a --path /b ... [--timeout 20]

Sends every request (GET, `:authority` 127.0.0.1:P) before reading any answer, then prints
{"responses": [{"path", "status", "body"}...]} as JSON (in the order of --path) and exits 0;
exit 1 when a stream was reset or the connection ended early.
"""
import argparse
import json
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", action="append", default=[])
    p.add_argument("--timeout", type=float, default=20)
    # --bearer T, once per --path in the same order: that request carries `authorization: Bearer T`.
    p.add_argument("--bearer", action="append", default=[])
    args = p.parse_args()
    sock = socket.create_connection(("127.0.0.1", args.port), timeout=args.timeout)
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    streams = {}
    if args.bearer and len(args.bearer) != len(args.path):
        p.error("--bearer must be given once per --path")
    for i, path in enumerate(args.path):
        sid = conn.get_next_available_stream_id()
        extra = [("authorization", "Bearer " + args.bearer[i])] if args.bearer else []
        conn.send_headers(sid, [(":method", "GET"), (":scheme", "http"), (":authority", "127.0.0.1:%d" % args.port),
                                (":path", path)] + extra, end_stream=True)
        streams[sid] = {"path": path, "status": None, "body": b"", "done": False}
    sock.sendall(conn.data_to_send())
    deadline = time.monotonic() + args.timeout
    failed = None
    while not all(s["done"] for s in streams.values()) and failed is None and time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            failed = "connection closed"
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                streams[event.stream_id]["status"] = int(dict(event.headers)[":status"])
            elif isinstance(event, h2.events.DataReceived):
                streams[event.stream_id]["body"] += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                streams[event.stream_id]["done"] = True
            elif isinstance(event, h2.events.StreamReset):
                failed = "stream %d reset (error %s)" % (event.stream_id, event.error_code)
            elif isinstance(event, h2.events.ConnectionTerminated):
                failed = "GOAWAY %s" % event.error_code
        sock.sendall(conn.data_to_send())
    out = [{"path": s["path"], "status": s["status"], "body": s["body"].decode("utf-8", "replace")} for s in streams.values()]
    print(json.dumps({"responses": out, "error": failed}))
    if failed is not None or not all(s["done"] for s in streams.values()):
        print("h2c_client: %s; %s" % (failed or "timed out", json.dumps(out)), file=sys.stderr)
    return 0 if failed is None and all(s["done"] for s in streams.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
