"""nodekit/system/ssh.py: the relay hop's ssh command line as the real OpenSSH reads it."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from nodekit.system import ssh


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client here")
def test_a_relay_hop_offers_aes_gcm_first_and_every_default_cipher(tmp_path: Path) -> None:
    """Every byte of a relay tree's stream is encrypted once per hop on a node that also decrypts, hashes and
    writes it: the hop asks for the cipher that costs least with AES instructions, and still offers the rest of
    OpenSSH's defaults (a node whose sshd allows only chacha20 keeps working)."""
    words = shlex.split(ssh.hop_words(connect_timeout=5, pinned=ssh.Pinned(str(tmp_path / "kh"), "node-1"),
                                      identity=str(tmp_path / "key")))  # fmt: skip
    assert words[0] == "ssh"
    seen = subprocess.run([*words, "-G", "-p", "22", "--", "root@10.0.0.9"], capture_output=True, text=True,
                          timeout=30, check=True).stdout  # fmt: skip
    ciphers = next(ln.split()[1] for ln in seen.splitlines() if ln.startswith("ciphers ")).split(",")
    assert ciphers[0] == "aes128-gcm@openssh.com", ciphers
    default = subprocess.run(["ssh", "-F", "/dev/null", "-G", "x"], capture_output=True, text=True, timeout=30,
                             check=True).stdout  # fmt: skip
    defaults = next(ln.split()[1] for ln in default.splitlines() if ln.startswith("ciphers ")).split(",")
    assert sorted(ciphers) == sorted(defaults)
