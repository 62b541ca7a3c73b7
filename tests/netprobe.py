"""What the edge tests poke services with: raw HTTP over real sockets, certificates made on
the spot (a CA, a server certificate for 127.0.0.1, a client certificate), RSS of a process."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RawReply:
    status: int | None  # None: the connection closed (or timed out) without a status line
    head: bytes
    body: bytes
    seconds: float
    closed: bool  # the server closed the connection

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode()
        return None


def raw_http(port: int, data: bytes, timeout: float = 5.0, host: str = "127.0.0.1",
             context: ssl.SSLContext | None = None) -> RawReply:
    """Send bytes as they are, read until the server closes, one full reply arrives, or `timeout`."""
    started = time.monotonic()
    sock = socket.create_connection((host, port), timeout=timeout)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname=host)
    out = b""
    closed = False
    try:
        sock.sendall(data)
        deadline = started + timeout
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except (ConnectionResetError, ssl.SSLError):
                closed = True
                break
            if not chunk:
                closed = True
                break
            out += chunk
            if _complete(out):
                break
    finally:
        sock.close()
    head, _, body = out.partition(b"\r\n\r\n")
    status = None
    if head.startswith(b"HTTP/"):
        status = int(head.split(b" ", 2)[1])
    return RawReply(status, head, body, time.monotonic() - started, closed)


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def post(path: str, body: bytes, content_type: str = "application/x-protobuf", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Threads for {pid}")


@dataclass
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: trusting only it must fail


def make_certs(directory: Path) -> Certs:
    """A throw-away PKI made with `cryptography`: CA -> server (127.0.0.1, localhost) and client."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return key, cert

    def leaf(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, name: str,
             server: bool) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(ca_cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                         else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = ca("mycroft test CA")
    server_key, server_cert = leaf(ca_key, ca_cert, "127.0.0.1", server=True)
    client_key, client_cert = leaf(ca_key, ca_cert, "rank-0", server=False)
    _, other = ca("some other CA")
    return Certs(ca=write_cert(ca_cert, directory / "ca.pem"),
                 server_cert=write_cert(server_cert, directory / "server.pem"),
                 server_key=write_key(server_key, directory / "server.key"),
                 client_cert=write_cert(client_cert, directory / "client.pem"),
                 client_key=write_key(client_key, directory / "client.key"),
                 other_ca=write_cert(other, directory / "other-ca.pem"))
