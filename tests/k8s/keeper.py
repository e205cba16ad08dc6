#!/usr/bin/python3
"""The local control plane's keeper (started by tests/k8s/cluster.py, stopped with it).

- Refreshes gpuguard's ServiceAccount token file at four fifths of its lifetime, as the kubelet
  does for a projected token; gpuguard re-reads the file when it changes.
- With several gpuguard processes, listens on the webhook port and forwards each connection to
  the next process in turn: the tests' stand-in for a Service and its endpoints (there is no
  kube-proxy here), a plain TCP forwarder, TLS passes through untouched.
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


async def forward(listen, backends):
    turn = 0

    async def handle(reader, writer):
        nonlocal turn
        port = backends[turn % len(backends)]
        turn += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        writer.close()
        up_writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


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
    tasks = [refresh_tokens(cluster)]
    if state["replicas"] > 1:
        tasks.append(forward(state["ports"]["webhook"], state["ports"]["replicas"]))
    if state.get("owner"):
        tasks.append(reap_when_gone(cluster, state["owner"]))
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main())
