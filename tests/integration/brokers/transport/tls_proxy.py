"""A TLS-terminating TCP proxy in front of the plain test Redis, and a throwaway cert.

The test Redis has no TLS, so ``rediss://`` is tested through this proxy: clients speak
TLS to it, it speaks plain RESP to Redis on loopback. It counts the TLS handshakes it
completed, so a test can tell the traffic really went over TLS.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SelfSigned:
    cert: Path
    key: Path


def self_signed_cert(folder: Path) -> SelfSigned | None:
    """A self-signed certificate for 127.0.0.1 made with ``openssl``; None without it."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return SelfSigned(cert, key)


class TlsProxy:
    """Accepts TLS on 127.0.0.1:<port> and forwards the bytes to a plain TCP upstream."""

    def __init__(self, cert: SelfSigned, upstream: tuple[str, int]) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert.cert, cert.key)
        self.upstream = upstream
        self.port = 0
        self.handshakes = 0
        self.protocols: set[str] = set()
        self.bytes_forwarded = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tls-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.WriteTransport] = set()
        self._error: BaseException | None = None

    def start(self) -> TlsProxy:
        self._thread.start()
        if not self._ready.wait(timeout=10) or self._error is not None:
            raise RuntimeError(f"TLS proxy did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        """Close the listener and every proxied connection, then end the loop's thread."""
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._listen())
        except BaseException as exc:  # reported by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for transport in list(self._transports):
            transport.abort()  # no TLS close handshake with clients that may be gone
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        ssl_object = writer.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.handshakes += 1
            self.protocols.add(str(ssl_object.version()))
        self._transports.add(writer.transport)
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            self._transports.add(up_writer.transport)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for stream in (up_writer, writer):
                if stream is not None:
                    stream.close()
                    self._transports.discard(stream.transport)
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                self.bytes_forwarded += len(data)
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()  # one side hung up: end the other direction too
