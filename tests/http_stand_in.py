"""The quiet base of the tests' stand-in HTTP servers for ``vllm serve``."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    """No access log on the test's output; ``send`` answers 200 with a whole body."""

    def log_message(self, *args):
        pass

    def send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
