"""Certificates of the local control plane, made at start with the openssl command: a cluster CA,
the API server's serving certificate, client certificates for the admin, the controller manager
and the scheduler (their identities are the ones the API server's bootstrap RBAC knows), and the
service account signing key.  Nothing here is committed; every start makes new ones."""

import os
import subprocess
from pathlib import Path

DAYS = "30"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _key(dir, name):
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", f"{name}.key", cwd=dir)


def _signed(dir, name, subject, ext):
    """A certificate for name.key signed by the CA, with the extensions in ext."""
    _key(dir, name)
    (dir / f"{name}.ext").write_text(ext)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=dir)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", DAYS, "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.crt", cwd=dir)


CLIENTS = {
    # name: subject; O=system:masters is the admin group, the others are bootstrap RBAC users.
    "admin": "/O=system:masters/CN=gpuguard-e2e-admin",
    "controller-manager": "/CN=system:kube-controller-manager",
    "scheduler": "/CN=system:kube-scheduler",
}


def make(dir: Path):
    """Write every key and certificate into dir (mode 0700; keys 0600 from their creation)."""
    dir.mkdir(parents=True, exist_ok=True)
    dir.chmod(0o700)
    umask = os.umask(0o077)
    try:
        _make(dir)
    finally:
        os.umask(umask)


def _make(dir):
    _key(dir, "ca")
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=gpuguard-e2e-cluster-ca",
             "-days", DAYS, "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt", cwd=dir)
    _signed(dir, "apiserver", "/CN=kube-apiserver",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1\n")
    for name, subject in CLIENTS.items():
        _signed(dir, name, subject,
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                "extendedKeyUsage=clientAuth\n")
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "sa.key", cwd=dir)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=dir)
