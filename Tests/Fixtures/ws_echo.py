#!/usr/bin/env python3
"""A real WebSocket peer (the `websockets` package) for bearerd's end-to-end tests.

server: echoes every message (text or binary); a text message `whoami` is answered with the
  Authorization header of that connection's handshake. Prints `READY <port>`; exits when stdin
  closes.
client --url URL --bytes N: sends one binary message of N pseudo-random bytes, checks the echo,
  asks `whoami`, prints {"ok": bool, "echoed_bytes": N, "whoami": "..."}.
"""
import argparse
import asyncio
import json
import os
import sys

import websockets

LIMIT = 64 << 20


async def serve(port):
    async def handler(ws):
        auth = ws.request.headers.get("Authorization", "")
        async for message in ws:
            if message == "whoami":
                await ws.send(auth)
            else:
                await ws.send(message)

    async with websockets.serve(handler, "127.0.0.1", port, max_size=LIMIT) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"READY {port}", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)


async def client(url, n):
    payload = os.urandom(n)
    out = {"ok": False, "echoed_bytes": 0, "whoami": ""}
    async with websockets.connect(url, max_size=LIMIT, open_timeout=20) as ws:
        await ws.send(payload)
        echo = await asyncio.wait_for(ws.recv(), 60)
        out["echoed_bytes"] = len(echo)
        await ws.send("whoami")
        out["whoami"] = await asyncio.wait_for(ws.recv(), 20)
        out["ok"] = echo == payload
    print(json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, default=0)
    c = sub.add_parser("client")
    c.add_argument("--url", required=True)
    c.add_argument("--bytes", type=int, default=1024)
    a = p.parse_args()
    asyncio.run(serve(a.port) if a.mode == "server" else client(a.url, a.bytes))


if __name__ == "__main__":
    main()
