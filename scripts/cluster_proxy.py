"""A TCP load balancer standing in for a Kubernetes Service in scripts/cluster.sh.

Each new connection goes to the next backend in turn; a backend that refuses the connection
is skipped (as kube-proxy stops sending to a pod that is gone), so clients of a killed
control-plane replica reconnect to the other one. Connection-level, like a ClusterIP Service:
an HTTP/2 or gRPC stream stays on the replica it reached.

    python3 cluster_proxy.py LISTEN_PORT BACKEND_HOST:PORT [BACKEND...]

Standard library only; runs until killed.
"""

import asyncio
import itertools
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except ConnectionError:
            pass


async def main(port: int, backends: list[tuple[str, int]]) -> None:
    turn = itertools.cycle(range(len(backends)))

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        start = next(turn)
        for i in range(len(backends)):
            host, bport = backends[(start + i) % len(backends)]
            try:
                up_r, up_w = await asyncio.wait_for(asyncio.open_connection(host, bport), 2)
                break
            except (TimeoutError, OSError):
                continue
        else:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen = int(sys.argv[1])
    targets = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in sys.argv[2:]]
    asyncio.run(main(listen, targets))
