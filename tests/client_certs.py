"""Client certificates for the TLS tests, issued by a throwaway trustme CA.

A certificate naming its identity only in the subject's common name (no subject alternative name at all)
is what tests the identity fallback to the CN. trustme always writes a SubjectAlternativeName extension,
empty for such a certificate, which newer `cryptography` releases refuse to build; so that one is built
here with `cryptography` itself, signed by the same CA."""

from __future__ import annotations

import datetime

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def issue_client_cert(ca: trustme.CA, *identities: str, common_name: str | None = None) -> trustme.LeafCert:
    """A client certificate from `ca` for these SAN identities (trustme's own), or, with none, one whose
    only identity is the subject CN `common_name`."""
    if identities:
        return ca.issue_cert(*identities, common_name=common_name)
    if common_name is None:
        raise ValueError("a client certificate needs an identity: a SAN or a common name")
    return _common_name_only(ca, common_name)


def _common_name_only(ca: trustme.CA, common_name: str) -> trustme.LeafCert:
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey), type(ca_key)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return trustme.LeafCert(key_pem, cert.public_bytes(serialization.Encoding.PEM), [])
