"""Server-side TLS, built once from `[server]` and shared by every listener (gRPC, /metrics, later HTTP).

With `tls_client_ca_file` set, every listener requires a client certificate signed by that CA (mTLS).
The files are read when the server is built (at startup); a missing or unreadable file, or a certificate
that does not match its key, is a ConfigError.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from scheduler_svc.config import ConfigError, ServerConfig


@dataclass(frozen=True)
class ServerTls:
    """The PEM material of one server identity, and the credentials each kind of listener needs."""

    cert_file: str
    key_file: str
    client_ca_file: str
    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None

    @classmethod
    def from_config(cls, server: ServerConfig) -> ServerTls | None:
        """The TLS settings of `server`, files read and checked; None when TLS is off."""
        if not server.tls_cert_file and not server.tls_key_file:
            if server.tls_client_ca_file:
                raise ConfigError("server.tls_client_ca_file needs server.tls_cert_file and server.tls_key_file")
            return None
        if not (server.tls_cert_file and server.tls_key_file):
            raise ConfigError("server.tls_cert_file and server.tls_key_file: set both (TLS on) or neither")
        tls = cls(
            cert_file=server.tls_cert_file,
            key_file=server.tls_key_file,
            client_ca_file=server.tls_client_ca_file,
            cert_chain=_read("server.tls_cert_file", server.tls_cert_file),
            private_key=_read("server.tls_key_file", server.tls_key_file),
            client_ca=_read("server.tls_client_ca_file", server.tls_client_ca_file)
            if server.tls_client_ca_file
            else None,
        )
        tls.ssl_context()  # a certificate that does not match its key fails here, not at the first call
        return tls

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by the client CA."""
        return self.client_ca is not None

    def ssl_context(self) -> ssl.SSLContext:
        """A server SSLContext for HTTP listeners (aiohttp), with the same certificate and client rule."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca is not None:
                context.load_verify_locations(cadata=self.client_ca.decode("ascii", "replace"))
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"server TLS ({self.cert_file}, {self.key_file}): {exc}") from exc
        return context


def _read(name: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc}") from exc
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{name}: {path} is not a PEM file")
    return data
