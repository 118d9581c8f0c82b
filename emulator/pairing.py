"""Pairing material of emulated iPhones: the host's root and host certificates, each device's key.

One host identity (a HostID, a root CA and a host certificate) pairs every device of a fleet, as
on a real lab host; each device has its own RSA key and a device certificate signed by the root.
The device serves its lockdown session's TLS with that certificate.
"""

from __future__ import annotations

import datetime
import ssl
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

KEY_BITS = 2048


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(
    subject_key: rsa.RSAPublicKey,
    issuer_key: rsa.RSAPrivateKey,
    common_name: str,
    issuer_name: str,
    is_ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(subject_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .sign(issuer_key, hashes.SHA256())
    )


@dataclass(frozen=True)
class HostIdentity:
    host_id: str
    system_buid: str
    root_key: rsa.RSAPrivateKey
    root_certificate: x509.Certificate
    host_key: rsa.RSAPrivateKey
    host_certificate: x509.Certificate

    @classmethod
    def generate(cls) -> HostIdentity:
        root_key, host_key = _new_key(), _new_key()
        root_certificate = _certificate(
            root_key.public_key(),
            root_key,
            "decodebench emulated root",
            "decodebench emulated root",
            True,
        )
        host_certificate = _certificate(
            host_key.public_key(),
            root_key,
            "decodebench emulated host",
            "decodebench emulated root",
            False,
        )
        return cls(
            host_id=str(uuid.uuid4()).upper(),
            system_buid=str(uuid.uuid4()).upper(),
            root_key=root_key,
            root_certificate=root_certificate,
            host_key=host_key,
            host_certificate=host_certificate,
        )


@dataclass
class DeviceKeys:
    """A device's key pair and its certificate from the host that paired it."""

    key: rsa.RSAPrivateKey
    certificate: x509.Certificate
    _tls: ssl.SSLContext | None = field(default=None, repr=False)

    @classmethod
    def generate(cls, host: HostIdentity) -> DeviceKeys:
        key = _new_key()
        certificate = _certificate(
            key.public_key(),
            host.root_key,
            "decodebench emulated device",
            "decodebench emulated root",
            False,
        )
        return cls(key=key, certificate=certificate)

    @property
    def public_key_pem(self) -> bytes:
        """What lockdown reports as DevicePublicKey: PKCS#1 PEM, like a real device."""
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.PKCS1
        )

    def server_context(self) -> ssl.SSLContext:
        """TLS server context for the lockdown session (any host certificate is accepted)."""
        if self._tls is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.verify_mode = ssl.CERT_NONE
            # load_cert_chain only reads files: write the PEMs to a private temporary file.
            with tempfile.TemporaryDirectory(prefix="dbk-emulated-tls-") as directory:
                pem = Path(directory) / "device.pem"
                pem.write_bytes(
                    self.certificate.public_bytes(serialization.Encoding.PEM) + _pem_key(self.key)
                )
                context.load_cert_chain(pem)
            self._tls = context
        return self._tls


def pair_record(host: HostIdentity, device: DeviceKeys, wifi_mac: str) -> dict[str, Any]:
    """The record usbmuxd hands to hosts (ReadPairRecord), as lockdown pairing would have saved it."""
    pem = serialization.Encoding.PEM
    return {
        "DeviceCertificate": device.certificate.public_bytes(pem),
        "HostCertificate": host.host_certificate.public_bytes(pem),
        "HostPrivateKey": _pem_key(host.host_key),
        "RootCertificate": host.root_certificate.public_bytes(pem),
        "RootPrivateKey": _pem_key(host.root_key),
        "HostID": host.host_id,
        "SystemBUID": host.system_buid,
        "WiFiMACAddress": wifi_mac,
        "EscrowBag": uuid.uuid4().bytes * 2,
    }
