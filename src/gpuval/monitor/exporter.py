"""`gpuval monitor --prometheus`: the latest reading as Prometheus metrics, named, typed, labelled and in the
units of DCGM-exporter (the table in dcgm_fields.py), so dashboards and alerts written for it read these too.

Labels are DCGM-exporter's: gpu, UUID, pci_bus_id, device, modelName, Hostname and the driver version
(DCGM_FI_DRIVER_VERSION, a label field of its default counters); DCGM_FI_DEV_XID_ERRORS adds err_code and
err_msg. A field NVML could not give a GPU is not exported for that GPU (DCGM-exporter skips DCGM's blank
values the same way); one GPU's NVML errors leave the other GPUs' metrics as they are. Framebuffer MiB are
not rounded down as DCGM's are. gpuval adds host and InfiniBand metrics under its own `gpuval_` prefix.

The text is rendered here rather than by prometheus_client's generate_latest, which names a counter
`NAME_total`: DCGM-exporter writes `# TYPE NAME counter` and samples named NAME, and alert rules match NAME.

Serving (MetricsServer): one event-loop thread holds every connection, so idle or slow clients cost no
thread; a connection that sends no complete request within the idle timeout is closed, and at most
MAX_CONNECTIONS are open at once (more are closed at accept). The text of a reading is rendered once, by
a one-thread pool, and every scrape of that reading is served the cached bytes: the monitor reads NVML
and the host once per interval, whatever the scrape rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from gpuval.errors import UsageError
from gpuval.monitor.dcgm_fields import GPU_METRICS, XID_ERRORS
from gpuval.monitor.sample import GpuReading, Reading
from gpuval.xids import describe

GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
DEFAULT_HOST = "127.0.0.1"  # metrics stay on this machine unless HOST says otherwise
IDLE_TIMEOUT_S = 10.0  # a connection silent this long (no complete request) is closed
MAX_CONNECTIONS = 512  # open at once; beyond, a new connection is closed at once
LISTEN_BACKLOG = 1024  # connections the kernel queues before accept (a burst of scrapes waits here)
MAX_REQUEST_HEAD = 16 * 1024  # bytes of request line and headers


def _gauge(gpu: GpuReading, attributes: tuple[str, ...], per: float) -> float | None:
    """The sum of the GPU's `attributes` in units of `per`; None when any is missing (not exported)."""
    values = [getattr(gpu, attribute) for attribute in attributes]
    if not all(isinstance(value, (int, float)) for value in values):
        return None
    return sum(values) / per


def _label(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _xid_labels(xid: float) -> dict[str, str]:
    """DCGM-exporter's err_code and err_msg; the message is gpuval's reading of NVIDIA's Xid catalog."""
    code = int(xid)
    return {"err_code": str(code), "err_msg": "No Error" if code == 0 else describe(code).meaning}


def metrics(reading: Reading) -> list[Metric]:
    """Every metric of one reading; the exporter serves these, tests read them directly too."""
    hostname = reading.hostname or ""
    families = []
    for field in GPU_METRICS:
        family = Metric(field.name, field.help, field.type)
        for gpu in reading.gpus:
            value = _gauge(gpu, field.attributes, field.per)
            if value is None:
                continue
            labels = dict(
                zip(
                    GPU_LABELS,
                    (
                        str(gpu.index),
                        _label(gpu.uuid),
                        _label(gpu.pci_bus_id),
                        f"nvidia{gpu.index}",
                        _label(gpu.name),
                        hostname,
                        reading.driver_version or "",
                    ),
                    strict=True,
                )
            )
            if field.name == XID_ERRORS:
                labels.update(_xid_labels(value))
            family.add_sample(field.name, labels, value)
        families.append(family)
    host = reading.host
    for name, documentation, value in (
        (
            "gpuval_host_cpu_percent",
            "Busy share of all CPUs since the last reading (in %).",
            host.cpu_percent,
        ),
        ("gpuval_host_memory_used_bytes", "Memory in use: MemTotal - MemAvailable.", host.memory_used_bytes),
        ("gpuval_host_memory_total_bytes", "MemTotal of /proc/meminfo.", host.memory_total_bytes),
        (
            "gpuval_host_load1",
            "Load average over 1 minute.",
            host.load_average[0] if host.load_average else None,
        ),
    ):
        family = Metric(name, documentation, "gauge")
        if value is not None:
            family.add_sample(name, {"Hostname": hostname}, value)
        families.append(family)
    for direction in ("rx", "tx"):
        name = f"gpuval_infiniband_{direction}_bytes_per_second"
        family = Metric(
            name,
            f"InfiniBand port data {'received' if direction == 'rx' else 'sent'}, from sysfs counters.",
            "gauge",
        )
        for port in reading.infiniband:
            value = getattr(port, f"{direction}_bytes_per_s")
            if value is not None:
                family.add_sample(
                    name, {"Hostname": hostname, "hca": port.hca, "port": str(port.port)}, value
                )
        families.append(family)
    return families


def _escape(text: str, quote: bool) -> str:
    """The text format's escapes: backslash and newline everywhere, the double quote in label values."""
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if quote else text


def _number(value: float) -> str:
    """A whole number as DCGM-exporter writes its integer fields ("%d"), any other as prometheus_client
    writes floats."""
    if float(value).is_integer() and abs(value) < 2**63:
        return str(int(value))
    return floatToGoString(value)


def exposition(families: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4 as DCGM-exporter writes it: HELP and TYPE under the metric's own name
    (a counter too), then one line per sample with its labels in the order given."""
    lines = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape(family.documentation, quote=False)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escape(value, quote=True)}"' for key, value in sample.labels.items())
            braced = f"{{{labels}}}" if labels else ""
            lines.append(f"{sample.name}{braced} {_number(sample.value)}")
    return ("\n".join(lines) + "\n").encode()


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or 'PORT' (these two on 127.0.0.1); '[::1]:9400' for IPv6."""
    host, _, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]") or DEFAULT_HOST
    # ASCII digits only: str.isdigit() also takes '²' and other digits int() refuses
    if not (port.isascii() and port.isdigit()) or len(port) > 5 or int(port) > 65535:
        raise UsageError(
            f"--prometheus '{text}': expected HOST:PORT, :PORT or PORT, e.g. 9400 (127.0.0.1 only) "
            "or 0.0.0.0:9400 (every interface)"
        )
    return host, int(port)


class MetricsServer:
    """/metrics over HTTP/1.1 (keep-alive) from a daemon thread running an asyncio loop; see the module
    docstring. `server_address` is where it listens (port 0 took a free one); `shutdown()` then
    `server_close()` stop it, as for the socketserver it replaces."""

    def __init__(
        self,
        address: tuple[str, int],
        latest: Callable[[], Reading | None],
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.latest = latest
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.renders = 0  # readings rendered to text (tests: one per reading, not one per scrape)
        self._cached: tuple[Any, bytes] = (object(), b"")  # (reading, its text)
        self._rendering: tuple[Any, asyncio.Future[bytes]] | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuval-exporter-render")
        self._loop = asyncio.new_event_loop()
        host, port = address
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._client, host, port, backlog=LISTEN_BACKLOG, limit=MAX_REQUEST_HEAD)
            )
        # UnicodeError: a host name that IDNA cannot encode ('..', a label past 63 characters)
        except (OSError, UnicodeError) as exc:
            self._loop.close()
            self._pool.shutdown(wait=False)
            raise UsageError(
                f"--prometheus {host}:{port}: cannot listen there: {getattr(exc, 'strerror', None) or exc}; "
                "choose another HOST:PORT"
            ) from None
        self.server_address = self._server.sockets[0].getsockname()
        self.server_port = self.server_address[1]
        self.thread = threading.Thread(target=self._loop.run_forever, name="gpuval-exporter", daemon=True)
        self.thread.start()

    def shutdown(self) -> None:
        """Stop listening, close every connection and stop the loop thread."""
        if self._loop.is_closed() or not self.thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self.thread.join(timeout=5)

    def server_close(self) -> None:
        if not self.thread.is_alive() and not self._loop.is_closed():
            self._loop.close()
        self._pool.shutdown(wait=False)

    async def _stop(self) -> None:
        self._server.close()
        for task in list(self._clients):
            task.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._clients) >= self.max_connections or task is None:
            writer.close()
            return
        self._clients.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client gone, silent past the timeout, or sending a head too long: close it
        finally:
            self._clients.discard(task)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request head and answer it; whether the connection stays open for another."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_timeout_s)
        request, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        parts = request.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._answer(writer, "400 Bad Request", b"bad request\n", keep_alive=False)
            return False
        method, _target, version = parts
        connection = headers.get("connection", "")
        keep_alive = connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
        if headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers:
            keep_alive = False  # a body this server does not read: never parse it as the next request
        if method not in ("GET", "HEAD"):
            await self._answer(writer, "405 Method Not Allowed", b"GET or HEAD only\n", keep_alive=False)
            return False
        try:
            body = await self._body()
        except Exception as exc:  # noqa: BLE001 - a reading that cannot be rendered: say so, keep serving
            self._rendering = None
            await self._answer(writer, "500 Internal Server Error", f"{exc}\n".encode(), keep_alive=False)
            return False
        await self._answer(writer, "200 OK", body, keep_alive, head_only=method == "HEAD")
        return keep_alive

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        status: str,
        body: bytes,
        keep_alive: bool,
        head_only: bool = False,
    ) -> None:
        content_type = CONTENT_TYPE_LATEST if status.startswith("200") else "text/plain; charset=utf-8"
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + (b"" if head_only else body))
        await asyncio.wait_for(writer.drain(), self.idle_timeout_s)

    async def _body(self) -> bytes:
        """The text of the latest reading: rendered once per reading in the pool, cached for every scrape
        after (and shared by the scrapes that arrive while it renders)."""
        reading = self.latest()
        cached_reading, cached_text = self._cached
        if reading is cached_reading:
            return cached_text
        if self._rendering is None or self._rendering[0] is not reading:
            future = asyncio.wrap_future(self._pool.submit(self._render, reading))
            self._rendering = (reading, future)
        text = await asyncio.shield(self._rendering[1])
        if self._rendering is not None and self._rendering[0] is reading:
            self._cached, self._rendering = (reading, text), None
        return text

    def _render(self, reading: Reading | None) -> bytes:
        self.renders += 1
        return exposition(metrics(reading)) if reading is not None else b""


def serve(
    address: tuple[str, int], latest: Callable[[], Reading | None], **options: Any
) -> tuple[MetricsServer, threading.Thread]:
    """Serve /metrics at `address` from a daemon thread; port 0 takes a free port (server.server_port).
    `options`: MetricsServer's idle_timeout_s and max_connections."""
    server = MetricsServer(address, latest, **options)
    return server, server.thread
