"""Small readers of what engines send back: SSE bodies, Prometheus text, and a raw JSON POST.

Shared by the engine tests and the wire-format recorder (``scripts/engines/record_wire_formats.py``);
aiohttp is imported only by :func:`post_raw`.
"""

from __future__ import annotations


def sse_data(raw: str) -> list[str]:
    """Return the ``data:`` payloads of a raw SSE body, in order (``[DONE]`` included)."""
    out: list[str] = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        data = [ln[5:].removeprefix(" ") for ln in block.split("\n") if ln.startswith("data:")]
        if data:
            out.append("\n".join(data))
    return out


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """Sum the samples of metric ``name`` (exact name, optional label filter) in Prometheus text.

    Returns None when no sample matches (e.g. the metric is not exported at all).
    """
    total: float | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_str = head.partition("{")
        if metric != name:
            continue
        if any(f'{k}="{v}"' not in label_str for k, v in labels.items()):
            continue
        total = (total or 0.0) + float(value)
    return total


async def post_raw(url: str, payload: dict[str, object], timeout: float = 120.0) -> tuple[int, str]:
    """POST JSON and return (status, raw body text), streamed or not.

    Uses a fresh connector with ``force_close=True``: llama-server closes the connection after
    each streamed response, so pooled keep-alive connections would fail on reuse.
    """
    import aiohttp

    conn = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as s,
        s.post(url, json=payload) as resp,
    ):
        return resp.status, await resp.text()
