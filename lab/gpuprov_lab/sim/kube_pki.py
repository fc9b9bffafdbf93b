"""Real certificates for the SIMULATED cluster: a CA and leaf certificates made with the host's openssl,
the CA public-key pin kubeadm prints (sha256 of the SubjectPublicKeyInfo), kubeconfig files, and the
detached JWS that signs the cluster-info ConfigMap for bootstrap tokens (HS256 with the token secret)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import kube_util as u
from .kube_host import Host


class PKIError(RuntimeError):
    pass


CA_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {cn}
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,digitalSignature,keyEncipherment,keyCertSign
subjectKeyIdentifier = hash
"""

LEAF_EXT = """\
[v3]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = {eku}
authorityKeyIdentifier = keyid
{san}
"""


def _openssl(host: Host, *args: str, input: str | None = None) -> str:
    res = host.run(["openssl", *args], input=input, timeout=120)
    if res.returncode != 0:
        raise PKIError(f"openssl {args[0]} failed: {res.stderr.strip()}")
    return res.stdout


def new_key(host: Host) -> str:
    """An RSA-2048 private key in PKCS#1 PEM (what kubeadm writes). A host may carry a pool of
    pre-generated keys (tests: many simulated nodes on a small machine) that is used round-robin."""
    pool = getattr(host, "key_pool", None)
    if pool:
        key = pool.pop(0)
        pool.append(key)
        return str(key)
    return _openssl(host, "genrsa", "-traditional", "2048")


def public_key(host: Host, key_pem: str) -> str:
    return _openssl(host, "rsa", "-pubout", input=key_pem)


@dataclass
class CertKey:
    cert: str
    key: str


def make_ca(host: Host, cn: str, days: int = 3650) -> CertKey:
    key = new_key(host)
    with tempfile.TemporaryDirectory(prefix="kube-pki-") as d:
        Path(d, "key").write_text(key)
        Path(d, "cnf").write_text(CA_CNF.format(cn=cn))
        cert = _openssl(
            host,
            "req",
            "-x509",
            "-new",
            "-sha256",
            "-key",
            f"{d}/key",
            "-config",
            f"{d}/cnf",
            "-extensions",
            "v3_ca",
            "-days",
            str(days),
        )
    return CertKey(cert, key)


def _subject(cn: str, orgs: list[str] | None) -> str:
    def esc(v: str) -> str:
        return v.replace("/", r"\/")

    return "".join(f"/O={esc(o)}" for o in orgs or []) + f"/CN={esc(cn)}"


def sign_csr(
    host: Host,
    ca: CertKey,
    csr_pem: str,
    server: bool = False,
    client: bool = True,
    dns: list[str] | None = None,
    ips: list[str] | None = None,
    days: int = 365,
) -> str:
    eku = ",".join([*(["serverAuth"] if server else []), *(["clientAuth"] if client else [])]) or "clientAuth"
    san_items = [f"DNS:{d}" for d in dns or []] + [f"IP:{i}" for i in ips or []]
    san = f"subjectAltName = {','.join(san_items)}" if san_items else ""
    with tempfile.TemporaryDirectory(prefix="kube-pki-") as d:
        Path(d, "ca.crt").write_text(ca.cert)
        Path(d, "ca.key").write_text(ca.key)
        Path(d, "ca.key").chmod(0o600)
        Path(d, "csr").write_text(csr_pem)
        Path(d, "ext").write_text(LEAF_EXT.format(eku=eku, san=san))
        return _openssl(
            host,
            "x509",
            "-req",
            "-sha256",
            "-in",
            f"{d}/csr",
            "-CA",
            f"{d}/ca.crt",
            "-CAkey",
            f"{d}/ca.key",
            "-set_serial",
            "0x" + secrets.token_hex(8),
            "-days",
            str(days),
            "-extfile",
            f"{d}/ext",
            "-extensions",
            "v3",
        )


def new_csr(host: Host, key_pem: str, cn: str, orgs: list[str] | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="kube-pki-") as d:
        Path(d, "key").write_text(key_pem)
        Path(d, "key").chmod(0o600)
        Path(d, "cnf").write_text("[req]\ndistinguished_name = dn\n[dn]\n")
        return _openssl(
            host, "req", "-new", "-key", f"{d}/key", "-subj", _subject(cn, orgs), "-config", f"{d}/cnf"
        )


def make_cert(
    host: Host,
    ca: CertKey,
    cn: str,
    orgs: list[str] | None = None,
    server: bool = False,
    client: bool = True,
    dns: list[str] | None = None,
    ips: list[str] | None = None,
    days: int = 365,
) -> CertKey:
    key = new_key(host)
    csr = new_csr(host, key, cn, orgs)
    return CertKey(sign_csr(host, ca, csr, server, client, dns, ips, days), key)


def self_signed(host: Host, cn: str, dns: list[str], ips: list[str], days: int = 365) -> CertKey:
    key = new_key(host)
    san = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
    with tempfile.TemporaryDirectory(prefix="kube-pki-") as d:
        Path(d, "key").write_text(key)
        Path(d, "key").chmod(0o600)
        Path(d, "cnf").write_text(
            f"[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = {cn}\n[v3]\n"
            "basicConstraints = critical,CA:FALSE\nkeyUsage = critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage = serverAuth\nsubjectAltName = {san}\n"
        )
        cert = _openssl(
            host,
            "req",
            "-x509",
            "-new",
            "-sha256",
            "-key",
            f"{d}/key",
            "-config",
            f"{d}/cnf",
            "-extensions",
            "v3",
            "-days",
            str(days),
        )
    return CertKey(cert, key)


def cert_info(host: Host, cert_pem: str) -> dict[str, str]:
    """subject, issuer, notAfter of a certificate."""
    out = _openssl(
        host, "x509", "-noout", "-subject", "-issuer", "-enddate", "-nameopt", "RFC2253", input=cert_pem
    )
    info = {}
    for line in out.splitlines():
        k, _, v = line.partition("=")
        info[k.strip()] = v.strip()
    return info


def csr_subject(host: Host, csr_pem: str) -> tuple[str, list[str]]:
    """(CN, [O...]) of a certificate request."""
    out = _openssl(host, "req", "-noout", "-subject", "-nameopt", "RFC2253", input=csr_pem)
    subject = out.split("=", 1)[1].strip() if "=" in out else ""
    cn, orgs = "", []
    for part in re.split(r"(?<!\\),", subject):
        k, _, v = part.partition("=")
        v = v.replace("\\,", ",")
        if k.strip() == "CN":
            cn = v
        elif k.strip() == "O":
            orgs.append(v)
    return cn, orgs


_PEM_RE = re.compile(r"-----BEGIN ([A-Z ]+)-----(.*?)-----END \1-----", re.S)


def pem_der(pem: str, label: str) -> bytes:
    for m in _PEM_RE.finditer(pem):
        if m.group(1) == label:
            return base64.b64decode("".join(m.group(2).split()))
    raise PKIError(f"no {label} block in PEM data")


def spki_pin(host: Host, cert_pem: str) -> str:
    """'sha256:<hex>' of the certificate's SubjectPublicKeyInfo (the --discovery-token-ca-cert-hash)."""
    pub = _openssl(host, "x509", "-noout", "-pubkey", input=cert_pem)
    return "sha256:" + hashlib.sha256(pem_der(pub, "PUBLIC KEY")).hexdigest()


# ----------------------------------------------------------------------------------------- kubeconfig


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def kubeconfig(
    server: str,
    ca_pem: str,
    user: str,
    cluster: str = "kubernetes",
    cert: CertKey | None = None,
    token: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> dict[str, Any]:
    creds: dict[str, str] = {}
    if cert is not None:
        creds = {"client-certificate-data": b64(cert.cert), "client-key-data": b64(cert.key)}
    elif cert_file:
        creds = {"client-certificate": cert_file, "client-key": key_file or cert_file}
    if token:
        creds["token"] = token
    ctx = f"{user}@{cluster}"
    return {
        "apiVersion": "v1",
        "clusters": [
            {"cluster": {"certificate-authority-data": b64(ca_pem), "server": server}, "name": cluster}
        ],
        "contexts": [{"context": {"cluster": cluster, "user": user}, "name": ctx}],
        "current-context": ctx,
        "kind": "Config",
        "users": [{"name": user, "user": creds}],
    }


def dump_kubeconfig(cfg: dict[str, Any]) -> str:
    return u.yaml_dump(cfg)


# -------------------------------------------------------------------------------------- bootstrap JWS


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def jws_detached(payload: str, token_id: str, token_secret: str) -> str:
    """Compact JWS with detached payload (header..signature), HS256 keyed by the token secret."""
    header = _b64url(json.dumps({"alg": "HS256", "kid": token_id}, separators=(",", ":")).encode())
    signing_input = f"{header}.{_b64url(payload.encode())}".encode()
    sig = hmac.new(token_secret.encode(), signing_input, hashlib.sha256).digest()
    return f"{header}..{_b64url(sig)}"


def jws_valid(detached: str, payload: str, token_id: str, token_secret: str) -> bool:
    return hmac.compare_digest(detached.strip(), jws_detached(payload, token_id, token_secret))


TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")


def new_token() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return (
        "".join(secrets.choice(alphabet) for _ in range(6))
        + "."
        + "".join(secrets.choice(alphabet) for _ in range(16))
    )
