"""test_certs_cli.py - drive the real `gpuguard certs` binary (GPUGUARD_BIN).

Checks what lands on disk (files, modes), that the openssl command accepts
the chain and sees the expected names, the refusal to overwrite without
--force, --help, usage errors (exit 2), the caBundle line, --print-ca-bundle
and the kustomize patch of --kustomize-patch (tests/integration/test_deploy.py
renders it into deploy/overlays/provided-certs).  The openssl command only
inspects the output; gpuguard itself uses the library.
"""

import base64
import os
import shutil
import stat
import subprocess

import pytest
import yaml

BIN = os.environ.get("GPUGUARD_BIN")

pytestmark = [
    pytest.mark.skipif(
        not BIN, reason="GPUGUARD_BIN is not set: run through `make integration`"
    ),
    pytest.mark.skipif(
        shutil.which("openssl") is None,
        reason="the openssl command is needed to inspect the certificates",
    ),
]

FILES = ("ca.crt", "tls.crt", "tls.key")
SERVICE = "gpuguard"
NAMESPACE = "gpuguard-system"
SERVICE_SANS = [
    "DNS:gpuguard",
    "DNS:gpuguard.gpuguard-system",
    "DNS:gpuguard.gpuguard-system.svc",
    "DNS:gpuguard.gpuguard-system.svc.cluster.local",
]
DEV_SANS = SERVICE_SANS + ["DNS:localhost", "IP Address:127.0.0.1"]
FLAGS = (
    "--service",
    "--namespace",
    "--out",
    "--days",
    "--key-type",
    "--dev",
    "--force",
    "--kustomize-patch",
    "--print-ca-bundle",
    "--help",
)
# The webhook configurations of charts/gpuguard/templates/webhooks.yaml that the patch targets.
PATCH_TARGETS = [
    ("MutatingWebhookConfiguration", "gpuguard",
     ["mutate.gpuguard.io", "workloads.mutate.gpuguard.io"]),
    ("ValidatingWebhookConfiguration", "gpuguard",
     ["validate.gpuguard.io", "workloads.validate.gpuguard.io"]),
]


def run(*args):
    return subprocess.run(
        [BIN, "certs", *args], capture_output=True, text=True, timeout=120
    )


def make(out, *extra):
    return run("--service", SERVICE, "--namespace", NAMESPACE, "--out", str(out), *extra)


def make_ok(out, *extra):
    res = make(out, *extra)
    assert res.returncode == 0, res.stderr
    return res


def openssl(*args):
    return subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)


def sans(cert):
    res = openssl("x509", "-in", str(cert), "-noout", "-ext", "subjectAltName")
    assert res.returncode == 0, res.stderr
    # "X509v3 Subject Alternative Name: \n    DNS:a, DNS:b, IP Address:..."
    lines = res.stdout.strip().splitlines()
    return [name.strip() for name in lines[1].split(",")]


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def snapshot(directory):
    return {
        name: ((directory / name).read_bytes(), (directory / name).stat().st_mtime_ns)
        for name in os.listdir(directory)
    }


def test_writes_files_with_modes(tmp_path):
    out = tmp_path / "certs" / "dev"  # parents are created too
    res = make_ok(out)
    assert sorted(os.listdir(out)) == sorted(FILES)  # no temporaries left
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "tls.crt").stat().st_mode) == 0o644
    assert stat.S_IMODE((out / "ca.crt").stat().st_mode) == 0o644
    assert stat.S_IMODE(out.stat().st_mode) == 0o755 & ~current_umask()
    for name in FILES:
        assert f"{out}/{name}" in res.stdout
    assert (out / "tls.key").read_text().startswith("-----BEGIN PRIVATE KEY-----")
    # The CA key is not kept anywhere.
    assert "PRIVATE KEY" not in (out / "ca.crt").read_text()


def test_openssl_verifies_chain(tmp_path):
    make_ok(tmp_path)
    res = openssl(
        "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith(": OK")
    res = openssl(
        "verify",
        "-purpose", "sslserver",
        "-verify_hostname", "gpuguard.gpuguard-system.svc",
        "-CAfile", str(tmp_path / "ca.crt"),
        str(tmp_path / "tls.crt"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    res = openssl(
        "verify",
        "-verify_hostname", "evil.example.com",
        "-CAfile", str(tmp_path / "ca.crt"),
        str(tmp_path / "tls.crt"),
    )
    assert res.returncode != 0


@pytest.mark.parametrize("dev,want", [(False, SERVICE_SANS), (True, DEV_SANS)])
def test_subject_alt_names(tmp_path, dev, want):
    make_ok(tmp_path, *(["--dev"] if dev else []))
    assert sans(tmp_path / "tls.crt") == want


def test_subject_and_extensions(tmp_path):
    make_ok(tmp_path)
    res = openssl("x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-subject")
    assert "CN = gpuguard.gpuguard-system.svc" in res.stdout
    leaf = openssl(
        "x509", "-in", str(tmp_path / "tls.crt"), "-noout",
        "-ext", "basicConstraints,keyUsage,extendedKeyUsage",
    ).stdout
    assert "CA:FALSE" in leaf
    assert "Digital Signature" in leaf
    assert "TLS Web Server Authentication" in leaf
    ca = openssl(
        "x509", "-in", str(tmp_path / "ca.crt"), "-noout",
        "-ext", "basicConstraints,keyUsage",
    ).stdout
    assert "X509v3 Basic Constraints: critical" in ca
    assert "CA:TRUE" in ca
    assert "X509v3 Key Usage: critical" in ca
    assert "Certificate Sign, CRL Sign" in ca


@pytest.mark.parametrize(
    "key_type,bits,sigalg",
    [("ecdsa", 256, "ecdsa-with-SHA256"), ("rsa", 3072, "sha256WithRSAEncryption")],
)
def test_key_types(tmp_path, key_type, bits, sigalg):
    make_ok(tmp_path, "--key-type", key_type)
    text = openssl("x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-text").stdout
    assert f"Public-Key: ({bits} bit)" in text
    assert f"Signature Algorithm: {sigalg}" in text
    # The key file holds the certificate's key.
    cert_pub = openssl("x509", "-in", str(tmp_path / "tls.crt"), "-noout", "-pubkey")
    key_pub = openssl("pkey", "-in", str(tmp_path / "tls.key"), "-pubout")
    assert cert_pub.returncode == 0 and key_pub.returncode == 0
    assert cert_pub.stdout == key_pub.stdout


@pytest.mark.parametrize("days", [None, 10])
def test_validity_days(tmp_path, days):
    make_ok(tmp_path, *(["--days", str(days)] if days else []))
    days = days or 365
    cert = str(tmp_path / "tls.crt")
    day = 86400
    assert openssl("x509", "-in", cert, "-noout", "-checkend", str((days - 1) * day)).returncode == 0
    assert openssl("x509", "-in", cert, "-noout", "-checkend", str((days + 1) * day)).returncode == 1


def test_refuses_to_overwrite_without_force(tmp_path):
    make_ok(tmp_path)
    before = snapshot(tmp_path)
    res = make(tmp_path)
    assert res.returncode == 1
    assert str(tmp_path / "ca.crt") in res.stderr
    assert "--force" in res.stderr
    assert snapshot(tmp_path) == before


def test_refuses_when_any_target_exists(tmp_path):
    (tmp_path / "tls.key").write_text("keep me\n")
    res = make(tmp_path)
    assert res.returncode == 1
    assert str(tmp_path / "tls.key") in res.stderr
    assert os.listdir(tmp_path) == ["tls.key"]  # nothing else written
    assert (tmp_path / "tls.key").read_text() == "keep me\n"


def test_force_overwrites(tmp_path):
    make_ok(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in FILES}
    os.chmod(tmp_path / "tls.key", 0o644)
    make_ok(tmp_path, "--force")
    for name in FILES:
        assert (tmp_path / name).read_bytes() != before[name], name
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == sorted(FILES)
    res = openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt"))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_flag(flag):
    res = run(flag)
    assert res.returncode == 0
    for name in FLAGS:
        assert name in res.stdout, name
    assert "default 365" in res.stdout
    assert "default ecdsa" in res.stdout
    assert res.stderr == ""


BASE = ["--service", SERVICE, "--namespace", NAMESPACE, "--out", "{out}"]


@pytest.mark.parametrize(
    "args,flag",
    [
        (BASE + ["--bogus"], "--bogus"),
        (BASE + ["--days", "0"], "--days"),
        (BASE + ["--days=3651"], "--days"),
        (BASE + ["--days", "ten"], "--days"),
        (BASE + ["--days"], "--days"),
        (BASE + ["--key-type", "dsa"], "--key-type"),
        (BASE + ["--dev=yes"], "--dev"),
        (BASE + ["--force=1"], "--force"),
        (BASE + ["--kustomize-patch"], "--kustomize-patch"),
        (BASE + ["--kustomize-patch="], "--kustomize-patch"),
        (BASE + ["--print-ca-bundle=yes"], "--print-ca-bundle"),
        (BASE + ["extra"], "extra"),
        (BASE[2:], "--service"),
        (BASE[:2] + BASE[4:], "--namespace"),
        (BASE[:4], "--out"),
        (["--service", "Web_Hook"] + BASE[2:], "--service"),
        (BASE[:2] + ["--namespace", "-ns"] + BASE[4:], "--namespace"),
        (["--service="] + BASE[2:], "--service"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_usage_errors(tmp_path, args, flag):
    out = tmp_path / "out"
    res = run(*[a.replace("{out}", str(out)) for a in args])
    assert res.returncode == 2, res.stderr
    assert flag in res.stderr
    assert not out.exists()


def test_ca_bundle_line(tmp_path):
    res = make_ok(tmp_path)
    lines = [l for l in res.stdout.splitlines() if l.startswith("caBundle: ")]
    assert len(lines) == 1
    decoded = base64.b64decode(lines[0][len("caBundle: "):], validate=True)
    assert decoded == (tmp_path / "ca.crt").read_bytes()


def test_print_ca_bundle_prints_only_the_bundle(tmp_path):
    out = tmp_path / "out"
    res = make_ok(out, "--print-ca-bundle")
    ca = (out / "ca.crt").read_bytes()
    assert res.stdout == base64.b64encode(ca).decode() + "\n"
    assert res.stderr == ""
    assert sorted(os.listdir(out)) == sorted(FILES)


def read_patch(path):
    docs = list(yaml.safe_load_all(path.read_text()))
    assert len(docs) == len(PATCH_TARGETS)
    return docs


def test_kustomize_patch(tmp_path):
    out, patch = tmp_path / "out", tmp_path / "webhook-cabundle.yaml"
    res = make_ok(out, "--kustomize-patch", str(patch))
    assert f"wrote {patch} " in res.stdout
    assert stat.S_IMODE(patch.stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["out", "webhook-cabundle.yaml"]  # no temporaries
    ca = (out / "ca.crt").read_bytes()
    line = [l for l in res.stdout.splitlines() if l.startswith("caBundle: ")][0]
    docs = read_patch(patch)
    assert len(docs) == len(PATCH_TARGETS)
    for doc, (kind, name, hooks) in zip(docs, PATCH_TARGETS):
        assert doc["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert doc["kind"] == kind
        assert doc["metadata"] == {"name": name}
        # A strategic merge patch: each webhook is found by name, only caBundle is set.
        assert doc["webhooks"] == [{"name": hook, "clientConfig": {"caBundle": line[10:]}}
                                   for hook in hooks]
        assert base64.b64decode(line[10:], validate=True) == ca


def test_kustomize_patch_with_print_ca_bundle(tmp_path):
    out, patch = tmp_path / "out", tmp_path / "patch.yaml"
    res = make_ok(out, "--kustomize-patch", str(patch), "--print-ca-bundle")
    bundle = res.stdout.strip()
    assert res.stdout == bundle + "\n"
    for doc in read_patch(patch):
        assert [h["clientConfig"]["caBundle"] for h in doc["webhooks"]] == [bundle, bundle]


def test_kustomize_patch_refuses_to_overwrite(tmp_path):
    out, patch = tmp_path / "out", tmp_path / "patch.yaml"
    patch.write_text("keep me\n")
    res = make(out, "--kustomize-patch", str(patch))
    assert res.returncode == 1
    assert str(patch) in res.stderr and "--force" in res.stderr
    assert patch.read_text() == "keep me\n"
    assert not out.exists()  # nothing written at all
    assert sorted(os.listdir(tmp_path)) == ["patch.yaml"]


def test_kustomize_patch_not_written_when_certs_refused(tmp_path):
    out, patch = tmp_path / "out", tmp_path / "patch.yaml"
    make_ok(out)
    before = snapshot(out)
    res = make(out, "--kustomize-patch", str(patch))
    assert res.returncode == 1 and "--force" in res.stderr
    assert not patch.exists()
    assert snapshot(out) == before
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_kustomize_patch_force_replaces(tmp_path):
    out, patch = tmp_path / "out", tmp_path / "patch.yaml"
    make_ok(out, "--kustomize-patch", str(patch))
    first = patch.read_text()
    make_ok(out, "--kustomize-patch", str(patch), "--force")
    assert patch.read_text() != first
    ca = (out / "ca.crt").read_bytes()
    for doc in read_patch(patch):
        assert base64.b64decode(doc["webhooks"][0]["clientConfig"]["caBundle"]) == ca
    assert sorted(os.listdir(tmp_path)) == ["out", "patch.yaml"]


@pytest.mark.parametrize("where", ["missing-dir/patch.yaml", "."])
def test_kustomize_patch_bad_target(tmp_path, where):
    out = tmp_path / "out"
    target = tmp_path / where
    res = make(out, "--kustomize-patch", str(target), "--force")
    assert res.returncode == 1, res.stderr
    assert str(target) in res.stderr
    assert not out.exists()
