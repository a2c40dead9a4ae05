"""Certificates for the mutual-TLS tests, made with `openssl` at test time: a CA and a
certificate it signs for 127.0.0.1 / localhost, usable as server and client certificate."""

import os
import shutil
import subprocess
import tempfile


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca_and_cert(directory, ca_name, cert_name):
    """A CA (ca_name.pem/.key) and a certificate it signs for 127.0.0.1 / localhost,
    usable as server and client certificate (cert_name.pem/.key)."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={ca_name}",
             "-keyout", f"{ca_name}.key", "-out", f"{ca_name}.pem", cwd=directory)
    with open(os.path.join(directory, f"{cert_name}.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                "extendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cert_name}",
             "-keyout", f"{cert_name}.key", "-out", f"{cert_name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{cert_name}.csr", "-CA", f"{ca_name}.pem", "-CAkey", f"{ca_name}.key",
             "-CAcreateserial", "-days", "2", "-extfile", f"{cert_name}.ext", "-out", f"{cert_name}.pem",
             cwd=directory)


def read(directory, name):
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()


def make_test_certs(prefix):
    """A new directory holding ca.pem, service.pem/.key (signed by ca) and rogue.pem/.key
    (signed by another CA); None when openssl is not installed."""
    if shutil.which("openssl") is None:
        return None
    directory = tempfile.mkdtemp(prefix=prefix)
    make_ca_and_cert(directory, "ca", "service")
    make_ca_and_cert(directory, "rogue-ca", "rogue")  # a certificate of another CA
    return directory
