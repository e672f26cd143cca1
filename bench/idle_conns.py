#!/usr/bin/env python3
"""bench/idle_conns.py HOST PORT N: opens N keep-alive HTTP/1.1 connections to HOST:PORT, sends
one `GET /small` on each (at most 100 at a time), reads its response, and keeps every connection
open and idle. Prints `READY ok=<n> errors=<e>` once all N are idle, then waits until stdin closes
(or SIGTERM) and closes them. Standard library only (used by bench/run.sh)."""
import asyncio
import sys


async def one(host, port, sem, conns, errors):
    async with sem:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
            writer.write(f"GET /small HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            status = head.split(b" ", 2)[1]
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await asyncio.wait_for(reader.readexactly(length), 10)
            if status != b"200":
                raise RuntimeError(f"status {status!r}")
            conns.append(writer)
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(repr(e))


async def main():
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sem = asyncio.Semaphore(100)
    conns, errors = [], []
    await asyncio.gather(*(one(host, port, sem, conns, errors) for _ in range(n)))
    print(f"READY ok={len(conns)} errors={len(errors)}", flush=True)
    if errors:
        print("first error: " + errors[0], file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    for w in conns:
        w.close()


asyncio.run(main())
