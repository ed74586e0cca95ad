"""A static file server on 127.0.0.1 for the download tests (no internet needed).

Besides the files under its root it can play a misbehaving server (:meth:`Server.stream`): one
that trickles, sends more than it should, or announces a Content-Length its body does not have.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Server:
    """Serves ``root`` on a free local port and records the paths it was asked for
    (torchvision asks twice per file: once to resolve redirects, once to download)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        # path -> (chunks, announced Content-Length, pause before each chunk); see stream().
        self.streams: dict[str, tuple[Sequence[bytes], int | None, float]] = {}
        self.sent: dict[str, int] = {}  # path -> body bytes a stream wrote before it ended
        self.closing = threading.Event()  # wakes the streams' pauses when the server closes
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, fmt: str, *args: object) -> None:
                server.requests.append(self.path)

            def do_GET(self) -> None:
                if self.path in server.streams:
                    self.send_stream(*server.streams[self.path])
                else:
                    super().do_GET()

            def send_stream(self, chunks: Sequence[bytes], length: int | None, pause: float):
                # Counted from 0 before the headers leave: a client may refuse on the headers
                # alone and the test look at the count before this thread runs again.
                server.sent[self.path] = 0
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                if length is not None:
                    self.send_header("Content-Length", str(length))
                self.end_headers()  # HTTP/1.0: without a Content-Length, closing ends the body
                try:
                    for chunk in chunks:
                        if server.closing.wait(pause):
                            return
                        self.wfile.write(chunk)  # unbuffered: each chunk leaves at once
                        server.sent[self.path] += len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up: how a refusal looks from here

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        serve = partial(self.httpd.serve_forever, poll_interval=0.05)  # quick shutdown
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def serve(self, name: str, data: bytes) -> str:
        (self.root / name).write_bytes(data)
        return f"{self.url}/{name}"

    def stream(
        self, name: str, chunks: Sequence[bytes], *, length: int | None, pause: float = 0.0
    ) -> str:
        """Serve ``name`` as ``chunks``, each sent ``pause`` seconds after the previous one, under
        the Content-Length ``length`` (None: no Content-Length, the body ends when the
        connection closes). ``length`` need not be the body's true length: the server may lie.
        ``sent[f"/{name}"]`` counts the body bytes written before the body ended or the client
        hung up (bytes still in the sockets' buffers included)."""
        self.streams[f"/{name}"] = (chunks, length, pause)
        return f"{self.url}/{name}"

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
