"""A stand-in for OpenSLR's file server on 127.0.0.1, for the download tests: serves in-memory
files from a thread on a free port, with HTTP Range requests (`bytes=N-` and `bytes=N-M`, answered
206 with Content-Range, or 416 past the end, as Apache does) and faults on demand, each for the
next request of one path only:

- `cut_after(path, n)`: announce the whole length, send n bytes, close the connection;
- `stall_after(path, n)`: send n bytes, then hold the connection until `release()` (a client
  killed meanwhile);
- `fail(path, status)`: answer with an HTTP error (500, 404, ...);
- `ignore_range`: answer every request 200 with the whole file, as servers without Range support do.

`requests` records (path, Range header, status, body bytes sent) for every request. Written for
the tests, independently of recipes/archive_download.py.
"""

from __future__ import annotations

import http.server
import re
import threading


class ArchiveServer:
    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, tuple] = {}
        self.requests: list[tuple[str, str | None, int, int]] = []
        self.ignore_range = False
        self._released = threading.Event()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def cut_after(self, path: str, count: int) -> None:
        self.faults[path] = ("cut", count)

    def stall_after(self, path: str, count: int) -> None:
        self._released.clear()
        self.faults[path] = ("stall", count)

    def release(self) -> None:
        self._released.set()

    def fail(self, path: str, status: int) -> None:
        self.faults[path] = ("status", status)

    def bytes_sent(self, path: str) -> list[int]:
        return [sent for requested, _, _, sent in self.requests if requested == path]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                range_header = self.headers.get("Range")
                fault = server.faults.pop(self.path, None)
                if self.path not in server.files:
                    return self._finish(404, range_header)
                if fault and fault[0] == "status":
                    return self._finish(fault[1], range_header)
                data = server.files[self.path]
                start, end, status = 0, len(data), 200
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
                if match and not server.ignore_range:
                    start = int(match.group(1))
                    end = min(len(data), int(match.group(2)) + 1) if match.group(2) else len(data)
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        server.requests.append((self.path, range_header, 416, 0))
                        return
                    status = 206
                self.send_response(status)
                self.send_header("Content-Length", str(end - start))
                self.send_header("Accept-Ranges", "bytes")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                self.end_headers()
                body = data[start:end]
                if fault:   # cut or stall: part of the body, then the connection ends
                    body = body[:fault[1]]
                self.wfile.write(body)
                self.wfile.flush()
                server.requests.append((self.path, range_header, status, len(body)))
                if fault and fault[0] == "stall":
                    server._released.wait(timeout=60)
                self.close_connection = True

            def _finish(self, status, range_header):
                self.send_error(status)
                server.requests.append((self.path, range_header, status, 0))

        return Handler
