"""The floor of ``peers.py``: a process serving a length-prefixed echo over a Unix socket.

    python benchmarks/floor_server.py PATH

Binds PATH, prints ``ready`` on stdout, then answers every frame (a 4-byte big-endian length,
then a pickle) with a frame holding the pickle of what it unpickled, on any number of
connections, in one thread (``selectors``). It exits when its stdin reaches EOF. Standard
library only, and nothing else imported, so that its start-up is a floor too.
"""

from __future__ import annotations

import os
import pickle
import selectors
import socket
import sys


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(256)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    stdin = sys.stdin.fileno()
    selector.register(stdin, selectors.EVENT_READ, "stdin")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    buffers: dict[socket.socket, bytearray] = {}
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "accept":
                    connection, _ = listener.accept()
                    connection.setblocking(True)  # only read when readable; replies are small
                    buffers[connection] = bytearray()
                    selector.register(connection, selectors.EVENT_READ, "connection")
                    continue
                if key.data == "stdin":
                    if not os.read(stdin, 4096):
                        return
                    continue
                connection = key.fileobj
                assert isinstance(connection, socket.socket)
                data = connection.recv(65536)
                if not data:
                    selector.unregister(connection)
                    connection.close()
                    del buffers[connection]
                    continue
                buffer = buffers[connection]
                buffer += data
                while len(buffer) >= 4:
                    size = int.from_bytes(buffer[:4], "big")
                    if len(buffer) < 4 + size:
                        break
                    reply = pickle.dumps(pickle.loads(buffer[4 : 4 + size]))
                    del buffer[: 4 + size]
                    connection.sendall(len(reply).to_bytes(4, "big") + reply)
    finally:
        for connection in buffers:
            connection.close()
        listener.close()
        os.unlink(path)


if __name__ == "__main__":
    serve(sys.argv[1])
