"""Certificates and keys for a secure local Flower federation (`dpfl flower keys`); `cryptography` only.

- TLS: a self-signed CA (`ca.crt`, its key `ca.key`) and the SuperLink's certificate (`server.crt`, `server.key`),
  valid for 127.0.0.1, ::1 and localhost (more names with `hosts`). The SuperLink presents it on its one port;
  SuperNodes and `flwr` check it against `ca.crt`.
- Node authentication: one P-384 key pair per SuperNode, in the OpenSSH formats Flower reads (`node<i>` private,
  `node<i>.pub` public). The SuperLink (`--enable-supernode-auth`) refuses a SuperNode whose public key was not
  registered with `flwr supernode register node<i>.pub <connection>`.

Private keys are written with mode 0600. For a test or a demo: a deployment keeps the CA's key offline and each
node's private key on its node only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAYS = 365


def _write(path: Path, data: bytes, private: bool) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dpfl local federation"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def write_tls(folder: Path, hosts: tuple[str, ...] = ()) -> None:
    """ca.crt/ca.key and server.crt/server.key (for 127.0.0.1, ::1, localhost and `hosts`) in `folder`."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("dpfl local CA")).issuer_name(_name("dpfl local CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA384()))
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                     x509.IPAddress(ipaddress.ip_address("::1"))]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder().subject_name(_name("dpfl SuperLink")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA384()))
    _write(folder / "ca.key", _pem_key(ca_key), private=True)
    _write(folder / "ca.crt", ca.public_bytes(serialization.Encoding.PEM), private=False)
    _write(folder / "server.key", _pem_key(key), private=True)
    _write(folder / "server.crt", cert.public_bytes(serialization.Encoding.PEM), private=False)


def write_node_keys(folder: Path, name: str) -> None:
    """`name` (OpenSSH private key) and `name`.pub (OpenSSH public key): a P-384 pair for one SuperNode."""
    key = ec.generate_private_key(ec.SECP384R1())
    _write(folder / name, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                            serialization.NoEncryption()), private=True)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write(folder / f"{name}.pub", public + b"\n", private=False)


def write_keys(folder: Path, nodes: int, hosts: tuple[str, ...] = ()) -> tuple[list[Path], list[Path]]:
    """The CA, the SuperLink's certificate and `nodes` node key pairs (node0..node{nodes-1}) in `folder`: (written,
    kept). Nothing is ever overwritten: with a CA there (a new one would invalidate the certificates and
    registrations made with the old), only the missing node key pairs are written, so the step can run again."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.iterdir())
    tls = ("ca.crt", "ca.key", "server.crt", "server.key")
    present = [name for name in tls if (folder / name).exists()]
    if not present:
        write_tls(folder, hosts)
    elif len(present) < len(tls):
        raise FileExistsError(f"{folder} holds {', '.join(present)} but not all of {', '.join(tls)}: use another "
                              "folder, or remove those first")
    elif hosts:
        raise FileExistsError(f"{folder / 'server.crt'} exists: --host applies to a new certificate (another folder)")
    for i in range(nodes):
        if not (folder / f"node{i}").exists():
            write_node_keys(folder, f"node{i}")
    after = set(folder.iterdir())
    return sorted(after - before), sorted(before & after)
