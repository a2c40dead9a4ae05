"""A TCP relay that delays what it forwards, both ways: the network-delay fault for
kernels without sch_netem (tc netem), the way toxiproxy's latency toxic does it.

    python3 tcp_delay_relay.py --listen HOST:PORT --control FILE

It listens on HOST:PORT and forwards every connection to the target named in FILE,
delaying each chunk by delay_ms plus a uniform jitter in [-jitter_ms, +jitter_ms]
(never reordering a connection's bytes: a chunk leaves no earlier than the one before
it). FILE is JSON, re-read every 100 ms: {"target": "HOST:PORT", "delay_ms": 0,
"jitter_ms": 0}; connections arriving before a target is set are closed.

Each accepted socket gets TCP_USER_TIMEOUT and keepalives, so that a peer cut off
behind a dead link is given up within seconds (as gRPC's keepalive does), and closing
either side closes the other: the relay never keeps a stream alive for a peer that is
gone. Prints "relay listening on HOST:PORT" once it listens and "relay connection from
HOST:PORT" for each connection it forwards."""
import argparse
import asyncio
import json
import random
import socket
import time

CONFIG = {"target": None, "delay_ms": 0.0, "jitter_ms": 0.0}


def _read_control(path):
    try:
        with open(path) as f:
            CONFIG.update(json.load(f))
    except (OSError, ValueError):
        pass  # half-written or absent: keep the last good one


async def _watch(path):
    while True:
        _read_control(path)
        await asyncio.sleep(0.1)


def _harden(writer):
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 5000)


async def _pump(reader, writer, other):
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.ensure_future(send())
    last_due = 0.0
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            delay_s = max(0.0, CONFIG["delay_ms"] + random.uniform(-CONFIG["jitter_ms"], CONFIG["jitter_ms"])) / 1000
            last_due = max(last_due, time.monotonic() + delay_s)
            queue.put_nowait((last_due, data))
        queue.put_nowait((0.0, None))
        await sender
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        sender.cancel()
        for w in (writer, other):
            try:
                w.close()
            except OSError:
                pass


async def _serve(client_reader, client_writer):
    target = CONFIG["target"]
    if not target:
        client_writer.close()
        return
    peer = client_writer.get_extra_info("peername")
    print(f"relay connection from {peer[0]}:{peer[1]}", flush=True)
    host, port = target.rsplit(":", 1)
    try:
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
    except OSError:
        client_writer.close()
        return
    _harden(client_writer)
    _harden(server_writer)
    await asyncio.gather(_pump(client_reader, server_writer, client_writer),
                         _pump(server_reader, client_writer, server_writer), return_exceptions=True)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--control", required=True)
    args = parser.parse_args()
    _read_control(args.control)
    host, port = args.listen.rsplit(":", 1)
    server = await asyncio.start_server(_serve, host, int(port))
    bound = server.sockets[0].getsockname()
    print(f"relay listening on {bound[0]}:{bound[1]}", flush=True)
    asyncio.ensure_future(_watch(args.control))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
