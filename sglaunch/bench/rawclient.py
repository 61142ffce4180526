"""A lean streaming client for closed-loop throughput runs against our own server (issue 15).

httpx parses every chunk of a stream through h11, anyio and its line decoder: about 150-290 us of
client CPU per server-sent event on the 2-core development machine (benchmarks/http_vs_inprocess.py
--client httpx), so at tens of thousands of tokens per second a few Python client processes are
what limits. This client speaks just enough HTTP/1.1 for one server: keep-alive connections, one
per worker, a request with Content-Length, a 200 answer with a chunked body of server-sent
events. It counts events and reads nothing but the usage event at the end, parsed once.

It relies on what the server guarantees: each event is one chunk of the body (the bytes of an
event are contiguous), and JSON strings escape newlines, so a blank line (`\\n\\n`) only ever
ends an event. Anything else (a status other than 200, a connection closed early) raises
RawClientError.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

TAIL_BYTES = 8192  # the usage event and [DONE] are in the last bytes of a stream
_END = b"\r\n0\r\n\r\n"  # the chunked body's last chunk


class RawClientError(RuntimeError):
    pass


class _Reply(asyncio.Protocol):
    """One keep-alive connection; counts the events of the reply in progress."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def begin(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        self.done = loop.create_future()
        self.head: bytes | None = b""
        self.events = 0
        self.last = b""
        self.tail = b""
        return self.done

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():
            return
        if self.head is not None:  # status line and headers first
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data, self.head = self.head[:end], self.head[end + 4:], None
            if not head.startswith(b"HTTP/1.1 200"):
                status = head.split(b"\r\n", 1)[0].decode(errors="replace")
                self.done.set_exception(RawClientError(f"{status}: {data[:300]!r}"))
                return
            if b"transfer-encoding: chunked" not in head.lower():
                self.done.set_exception(RawClientError("the reply is not a chunked stream"))
                return
        self.events += (self.last + data).count(b"\n\n")
        self.last = data[-1:]
        tail = self.tail + data if len(data) < TAIL_BYTES else data
        self.tail = tail[-TAIL_BYTES:]
        if self.tail.endswith(_END):
            self.done.set_result(None)

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(RawClientError(f"the connection closed mid-reply ({exc})"))


class RawStreamClient:
    """POST streamed requests to one server over keep-alive connections (one per caller at a time)."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._idle: list[_Reply] = []

    async def stream(self, path: str, body: dict) -> tuple[int, dict | None]:
        """-> (events in the reply, the usage of its usage event or None)."""
        loop = asyncio.get_running_loop()
        reply = self._idle.pop() if self._idle else None
        if reply is None or reply.closed:
            _, reply = await loop.create_connection(_Reply, self.host, self.port)
        payload = json.dumps(body, separators=(",", ":")).encode()
        done = reply.begin(loop)
        reply.transport.write(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self.host.encode(), self.port,
                                                                 len(payload), payload))
        try:
            await done
        except BaseException:
            reply.transport.close()
            raise
        self._idle.append(reply)
        return reply.events, usage_of(reply.tail)

    def close(self) -> None:
        for reply in self._idle:
            reply.transport.close()
        self._idle.clear()


def usage_of(tail: bytes) -> dict | None:
    """The usage object of the last event in `tail` that has one."""
    at = tail.rfind(b'"usage":')
    if at < 0:
        return None
    start = tail.rfind(b"data: ", 0, at)
    end = tail.find(b"\n\n", at)
    if start < 0 or end < 0:
        return None
    usage = json.loads(tail[start + 6:end]).get("usage")
    return usage if isinstance(usage, dict) else None
