"""Certificate rotation without a restart and mutual TLS (the client CAs, the
key purpose and the names --client-cn and --client-san ask for), against the
running server.  Rotation is done the way the kubelet updates a Secret volume:
the new files go to a fresh directory and a `..data` symlink is swapped to it.
Client certificates are made here with the openssl CLI."""

import json
import os
import re
import shutil
import ssl
import subprocess

import pytest

from conftest import SERVICE, NAMESPACE, SNI, ApiServerConnection, start_server, wait_for
from test_server import metric, review


def make_certs(binary, out, *extra):
    subprocess.run([binary, "certs", "--service", SERVICE, "--namespace", NAMESPACE,
                    "--out", str(out), "--dev", "--force", *extra], check=True,
                   stdout=subprocess.DEVNULL)
    return out


class SecretVolume:
    """A directory laid out like a mounted Secret: tls.crt -> ..data/tls.crt."""

    def __init__(self, root):
        self.root = root
        root.mkdir()
        self.n = 0

    def publish(self, cert_src, key_src):
        self.n += 1
        version = self.root / f"..2026_11_21_{self.n:02d}"
        version.mkdir()
        (version / "tls.crt").write_bytes(cert_src.read_bytes())
        (version / "tls.key").write_bytes(key_src.read_bytes())
        tmp = self.root / "..data_tmp"
        os.symlink(version.name, tmp)
        os.replace(tmp, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            link = self.root / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)


def context(*cas):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for ca in cas:
        ctx.load_verify_locations(cafile=str(ca))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def serial_of(conn):
    return conn.sock.getpeercert()["serialNumber"]


def fresh_serial(srv, ctx):
    conn = ApiServerConnection(srv.port, None, context=ctx)
    status, _, _ = conn.review(review())
    assert status == 200
    serial = serial_of(conn)
    conn.close()
    return serial


def openssl_serial(cert):
    out = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", str(cert)],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().split("=")[1].upper()


@pytest.fixture
def rotation(binary, tmp_path):
    a = make_certs(binary, tmp_path / "a")
    b = make_certs(binary, tmp_path / "b")
    vol = SecretVolume(tmp_path / "secret")
    vol.publish(a / "tls.crt", a / "tls.key")
    srv = start_server(binary, a, tmp_path, "--tls-cert", str(vol.root / "tls.crt"),
                       "--tls-key", str(vol.root / "tls.key"))
    yield srv, vol, a, b
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def test_new_handshakes_see_the_rotated_certificate(rotation):
    srv, vol, a, b = rotation
    ctx = context(a / "ca.crt", b / "ca.crt")
    kept = ApiServerConnection(srv.port, None, context=ctx)
    assert kept.review(review())[0] == 200
    assert serial_of(kept).lstrip("0") == openssl_serial(a / "tls.crt").lstrip("0")
    old = fresh_serial(srv, ctx)
    vol.publish(b / "tls.crt", b / "tls.key")
    assert wait_for(lambda: fresh_serial(srv, ctx) != old)
    new = fresh_serial(srv, ctx)
    assert new.lstrip("0") == openssl_serial(b / "tls.crt").lstrip("0")
    # The connection opened before the rotation keeps working.
    for _ in range(3):
        assert kept.review(review())[0] == 200
    assert serial_of(kept) == old
    _, text = srv.ops("/metrics")
    assert metric(text, "gpuguard_tls_certificate_loads_total", result="ok") == 2
    not_after = ssl.cert_time_to_seconds(
        ssl._ssl._test_decode_cert(str(b / "tls.crt"))["notAfter"])
    assert metric(text, "gpuguard_tls_certificate_expiry_timestamp_seconds") == not_after


@pytest.mark.parametrize("breakage", ["mismatched key", "half-written key", "garbage cert"])
def test_a_bad_pair_is_refused_and_the_old_one_kept(rotation, tmp_path, breakage):
    srv, vol, a, b = rotation
    ctx = context(a / "ca.crt", b / "ca.crt")
    before = fresh_serial(srv, ctx)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tls.crt").write_bytes((b / "tls.crt").read_bytes())
    if breakage == "mismatched key":
        (bad / "tls.key").write_bytes((a / "tls.key").read_bytes())
    elif breakage == "half-written key":
        key = (b / "tls.key").read_bytes()
        (bad / "tls.key").write_bytes(key[: len(key) // 2])
    else:
        (bad / "tls.crt").write_bytes(b"not a certificate\n")
        (bad / "tls.key").write_bytes((b / "tls.key").read_bytes())
    vol.publish(bad / "tls.crt", bad / "tls.key")
    assert wait_for(lambda: any(r.get("msg", "").startswith("certificate reload refused")
                                for r in srv.log_lines()))
    assert fresh_serial(srv, ctx) == before
    _, text = srv.ops("/metrics")
    assert metric(text, "gpuguard_tls_certificate_loads_total", result="error") >= 1
    # A good pair afterwards is taken.
    vol.publish(b / "tls.crt", b / "tls.key")
    assert wait_for(lambda: fresh_serial(srv, ctx) != before)


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def sign_client(where, extensions):
    """(Re)issue where/client.crt from its request, signed by where/ca.key."""
    (where / "ext.cnf").write_text(extensions + "\n")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "client.crt", "-days", "2", "-extfile", "ext.cnf",
            cwd=where)
    return where


def client_cert(where, subject, extensions):
    """where/client.crt and .key for subject, signed by where/ca.key."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "client.key", "-out", "client.csr", "-subj", subject, cwd=where)
    return sign_client(where, extensions)


def client_pki(where, name, extensions="extendedKeyUsage=clientAuth"):
    """A client CA and a client certificate (CN kube-apiserver) signed by it."""
    where.mkdir()
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", f"/CN={name} CA",
            cwd=where)
    return client_cert(where, "/CN=kube-apiserver", extensions)


def same_ca(pki, where, subject, extensions):
    """Another client certificate from pki's CA, in where."""
    where.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copy(pki / name, where / name)
    return client_cert(where, subject, extensions)


@pytest.fixture
def mtls(binary, certs, tmp_path):
    good = client_pki(tmp_path / "good", "api-server")
    srv = start_server(binary, certs, tmp_path, "--client-ca", str(good / "ca.crt"))
    yield srv, good, client_pki(tmp_path / "other", "someone else")
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def mtls_context(certs, client=None):
    ctx = context(certs / "ca.crt")
    if client:
        ctx.load_cert_chain(str(client / "client.crt"), str(client / "client.key"))
    return ctx


def test_mtls_accepts_the_right_client_certificate(mtls, certs):
    srv, good, _ = mtls
    conn = ApiServerConnection(srv.port, None, context=mtls_context(certs, good))
    status, _, got = conn.review(review())
    assert status == 200 and got["response"]["allowed"] is True
    assert any(r.get("msg") == "serving" and r.get("mtls") is True for r in srv.log_lines())


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_mtls_refuses_at_the_handshake(mtls, certs, who):
    srv, _, other = mtls
    ctx = mtls_context(certs, other if who != "no certificate" else None)
    conn = ApiServerConnection(srv.port, None, context=ctx)
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        conn.review(review())
    # The server is still fine.
    good = ApiServerConnection(srv.port, None, context=mtls_context(certs, mtls[1]))
    assert good.review(review())[0] == 200


def refusals(srv):
    return [r for r in srv.log_lines()
            if r.get("msg") == "TLS handshake refused: client certificate not accepted"]


@pytest.mark.parametrize("who,reason", [
    ("no certificate", "no client certificate"),
    ("another CA's certificate", "The certificate issuer is unknown"),
    ("a server certificate", "does not match the intended purpose"),
])
def test_mtls_refusals_are_logged_with_the_reason(binary, certs, tmp_path, who, reason):
    """A server-only certificate (extended key usage serverAuth) from the
    trusted CA is no client certificate."""
    good = client_pki(tmp_path / "good", "api-server")
    srv = start_server(binary, certs, tmp_path, "--client-ca", str(good / "ca.crt"))
    try:
        client = None
        if who == "another CA's certificate":
            client = client_pki(tmp_path / "other", "someone else")
        elif who == "a server certificate":  # the same key and CA, serverAuth only
            shutil.copytree(good, tmp_path / "server-only")
            client = sign_client(tmp_path / "server-only", "extendedKeyUsage=serverAuth")
        conn = ApiServerConnection(srv.port, None, context=mtls_context(certs, client))
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            conn.review(review())
        assert wait_for(lambda: refusals(srv))
        (rec,) = refusals(srv)
        assert rec["level"] == "warn"
        assert reason in rec["reason"], rec
        assert re.fullmatch(r"127\.0\.0\.1:\d+", rec["peer"])
    finally:
        assert srv.stop() == 0


def test_mtls_accepts_a_certificate_without_extended_key_usage(binary, certs, tmp_path):
    plain = client_pki(tmp_path / "plain", "api-server", extensions="basicConstraints=CA:FALSE")
    srv = start_server(binary, certs, tmp_path, "--client-ca", str(plain / "ca.crt"))
    try:
        conn = ApiServerConnection(srv.port, None, context=mtls_context(certs, plain))
        assert conn.review(review())[0] == 200
        assert not refusals(srv)
    finally:
        assert srv.stop() == 0


def test_unreadable_client_ca_fails_the_start(binary, certs, tmp_path):
    (tmp_path / "ca.pem").write_text("nothing here\n")
    out = subprocess.run([binary, "serve", "--listen", "127.0.0.1:0", "--ops-listen",
                          "127.0.0.1:0", "--tls-cert", str(certs / "tls.crt"), "--tls-key",
                          str(certs / "tls.key"), "--client-ca", str(tmp_path / "ca.pem")],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 1
    assert "ca.pem: no PEM certificate in the file" in out.stderr


# ---- the names of the API server's certificate: --client-cn, --client-san ----------

DNS_NAME = "apiserver.gpuguard.test"
URI_NAME = "spiffe://cluster.local/ns/kube-system/sa/kube-apiserver"
CLIENT_AUTH = "extendedKeyUsage=clientAuth"


@pytest.fixture
def named_mtls(binary, certs, tmp_path):
    """mTLS that names the API server: CN kube-apiserver, or the DNS or URI SAN above."""
    pki = client_pki(tmp_path / "pki", "api-server")
    srv = start_server(binary, certs, tmp_path, "--client-ca", str(pki / "ca.crt"),
                       "--client-cn", "kube-apiserver", "--client-san", DNS_NAME,
                       "--client-san", URI_NAME)
    yield srv, pki
    if srv.proc.poll() is None:
        assert srv.stop() == 0


@pytest.mark.parametrize("subject,extensions", [
    ("/CN=kube-apiserver", CLIENT_AUTH),
    ("/CN=kube-apiserver", "basicConstraints=CA:FALSE"),  # no extended key usage
    ("/CN=webhook-client", f"{CLIENT_AUTH}\nsubjectAltName=DNS:other.test,DNS:{DNS_NAME}"),
    ("/CN=webhook-client", f"{CLIENT_AUTH}\nsubjectAltName=DNS:{DNS_NAME.upper()}"),
    ("/CN=webhook-client", f"{CLIENT_AUTH}\nsubjectAltName=URI:{URI_NAME}"),
], ids=["CN", "CN without EKU", "DNS SAN", "DNS SAN in capitals", "URI SAN"])
def test_named_mtls_accepts_a_certificate_with_a_name_given(named_mtls, certs, tmp_path,
                                                            subject, extensions):
    srv, pki = named_mtls
    client = same_ca(pki, tmp_path / "client", subject, extensions)
    conn = ApiServerConnection(srv.port, None, context=mtls_context(certs, client))
    assert conn.review(review())[0] == 200
    assert not refusals(srv)


@pytest.mark.parametrize("subject,extensions,reason", [
    ("/CN=kube-scheduler", CLIENT_AUTH,
     'certificate of CN "kube-scheduler" names none of the --client-cn and --client-san names'),
    ("/CN=KUBE-APISERVER", CLIENT_AUTH, 'certificate of CN "KUBE-APISERVER" names none'),
    ("/CN=kube-apiserver/CN=kube-scheduler", CLIENT_AUTH, "names none"),
    ("/CN=webhook-client",
     f"{CLIENT_AUTH}\nsubjectAltName=DNS:evil.{DNS_NAME},URI:{URI_NAME}/x,email:{DNS_NAME}",
     'certificate of CN "webhook-client" names none'),
    ("/CN=kube-apiserver", "extendedKeyUsage=serverAuth", "does not match the intended purpose"),
], ids=["another CN", "the CN in capitals", "two CNs", "other SANs", "serverAuth only"])
def test_named_mtls_refuses_other_certificates_of_the_ca(named_mtls, certs, tmp_path, subject,
                                                         extensions, reason):
    """Refused during the handshake, with the reason logged; the named client still connects."""
    srv, pki = named_mtls
    client = same_ca(pki, tmp_path / "client", subject, extensions)
    conn = ApiServerConnection(srv.port, None, context=mtls_context(certs, client))
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        conn.review(review())
    assert wait_for(lambda: refusals(srv))
    (rec,) = refusals(srv)
    assert reason in rec["reason"], rec
    assert re.fullmatch(r"127\.0\.0\.1:\d+", rec["peer"])
    good = ApiServerConnection(srv.port, None, context=mtls_context(certs, pki))
    assert good.review(review())[0] == 200
