"""A claim or upload whose answer the network loses, then retried."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from tests.support.api import bearer
from tests.support.services import query


class DroppingProxy:
    """Forwards one HTTP request per connection to the server and, while `drop` is set,
    swallows the server's answer and closes the connection: a response lost on the wire."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.drop = True
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.target_port)) as upstream:
            request = _read_message(client)
            upstream.sendall(request)
            response = _read_message(upstream)
            if not self.drop:
                client.sendall(response)

    def close(self) -> None:
        self.listener.close()


def _read_message(connection: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += connection.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        body += connection.recv(65536)
    return head + b"\r\n\r\n" + body


def lost_then_retried(stack, path: str, body: dict) -> tuple[list, httpx.Response]:
    """``body`` posted through a proxy that drops the server's answer, then again with the
    answer let through: the (device, run) pairs running between the two, and the second answer."""
    proxy = DroppingProxy(stack.port)
    headers = {**bearer(stack.tokens["agent"]), "Connection": "close"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{proxy.port}", timeout=10) as agent:
            with pytest.raises(httpx.TransportError):
                agent.post(path, json=body, headers=headers)
            held = query("SELECT device_udid, id FROM runs WHERE state = 'running' ORDER BY id")
            proxy.drop = False
            retried = agent.post(path, json=body, headers=headers)
    finally:
        proxy.close()
    return held, retried
