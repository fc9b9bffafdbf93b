"""The lab mirror's HTTP server (one process per lab, bound to the lab network's gateway address).

Run as ``python -m gpuprov_lab.httpserve --bind IP --port N --directory DIR``; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType


class MirrorHandler(SimpleHTTPRequestHandler):
    """Static files, keep-alive (apt fetches many files per connection), one log line per request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        sys.stdout.write(f"{self.address_string()} {format % args}\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gpuprov_lab.httpserve")
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--directory", required=True)
    args = ap.parse_args(argv)
    handler = functools.partial(MirrorHandler, directory=args.directory)
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer((args.bind, args.port), handler)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
