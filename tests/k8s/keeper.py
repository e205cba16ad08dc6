#!/usr/bin/python3
"""The local control plane's keeper (started by tests/k8s/cluster.py, stopped with it).

- Refreshes gpuguard's ServiceAccount token file at four fifths of its lifetime, as the kubelet
  does for a projected token; gpuguard re-reads the file when it changes.
- With several gpuguard processes, listens on the webhook port and forwards each connection to
  the next process in turn: the tests' stand-in for a Service and its endpoints (there is no
  kube-proxy here), a plain TCP forwarder, TLS passes through untouched.
- Is the API server's HTTPS proxy (cluster.py starts it with HTTPS_PROXY pointing here): a
  webhook whose clientConfig names a Service (`gpuguard.gpuguard-system.svc:443`) is reached
  through a CONNECT to the host and port the Service stands for, which this proxy maps to the
  ports DIR/services.json lists for it ({"host:port": [port, ...]}, read at each connection;
  cluster.py's `route`), each in turn.  The stand-in for Service routing a cluster without
  kube-proxy and pods has; the API server verifies the certificate against the Service's DNS
  name as in a cluster.  Loopback addresses never go through a proxy (Go's rule).
- With an owner (the state's "owner", `cluster.py up --owner PID`: `make e2e` passes its own
  shell), stops the whole cluster once that process is gone, so that a killed test run leaves
  nothing behind.

    keeper.py DIR
"""

import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster import TOKEN_SECONDS, Cluster  # noqa: E402

REFRESH = TOKEN_SECONDS * 4 // 5


async def refresh_tokens(cluster):
    wait = REFRESH
    while True:
        await asyncio.sleep(wait)
        try:
            await asyncio.to_thread(cluster.refresh_token)
            print("keeper: token refreshed", flush=True)
            wait = REFRESH
        except (SystemExit, Exception) as e:  # the API server may be restarting: soon again
            print(f"keeper: token refresh failed: {e}", flush=True)
            wait = 10


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still be sending
            return
    except (ConnectionError, OSError):
        pass
    writer.close()


async def splice(reader, writer, port, greeting=b""):
    """Connect to port on 127.0.0.1, send greeting to the client, and pipe both ways until both
    sides are done; a refused connection closes the client's."""
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.close()
        return
    writer.write(greeting)
    await writer.drain()
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
    writer.close()
    up_writer.close()


async def serve(listen, handle):
    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


async def forward(listen, backends):
    turn = 0

    async def handle(reader, writer):
        nonlocal turn
        turn += 1
        await splice(reader, writer, backends[(turn - 1) % len(backends)])

    await serve(listen, handle)


async def service_proxy(listen, routes_file):
    turns = {}

    async def handle(reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            routes = json.loads(routes_file.read_text()) if routes_file.exists() else {}
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            writer.close()
            return
        ports = routes.get(target) if method == "CONNECT" else None
        if not ports:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\nno such service\n")
            await writer.drain()
            writer.close()
            return
        turns[target] = turns.get(target, 0) + 1
        await splice(reader, writer, ports[(turns[target] - 1) % len(ports)],
                     b"HTTP/1.1 200 Connection established\r\n\r\n")

    await serve(listen, handle)


async def reap_when_gone(cluster, owner):
    while True:
        await asyncio.sleep(1)
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            break
        except PermissionError:  # there, but not ours to signal: alive
            pass
    print(f"keeper: owner {owner} is gone, stopping the cluster", flush=True)
    Cluster(cluster.dir).down(spare=("keeper",))
    os._exit(0)


async def main():
    cluster = Cluster(sys.argv[1])
    state = json.loads((cluster.dir / "state.json").read_text())
    tasks = [refresh_tokens(cluster),
             service_proxy(state["ports"]["proxy"], cluster.dir / "services.json")]
    if state["replicas"] > 1:
        tasks.append(forward(state["ports"]["webhook"], state["ports"]["replicas"]))
    if state.get("owner"):
        tasks.append(reap_when_gone(cluster, state["owner"]))
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main())
