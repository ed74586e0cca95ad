"""A static file server on 127.0.0.1 for the download tests (no internet needed)."""

from __future__ import annotations

import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Server:
    """Serves ``root`` on a free local port and records the paths it was asked for
    (torchvision asks twice per file: once to resolve redirects, once to download)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, fmt: str, *args: object) -> None:
                server.requests.append(self.path)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        serve = partial(self.httpd.serve_forever, poll_interval=0.05)  # quick shutdown
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def serve(self, name: str, data: bytes) -> str:
        (self.root / name).write_bytes(data)
        return f"{self.url}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
