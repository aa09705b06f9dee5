"""Every file the documents call secret is git-ignored and not committed.

The manifests' commands write secrets into a checkout (`deploy/compose/raft-secret`,
`deploy/compose/admin-token`, `fencingd dev`'s data dir, `fencingd keygen`'s private key): a
`git add -A` or `git commit -a` must never pick one up. The paths are taken from the documents
themselves, so a secret a document starts to name is checked the day it is named; the ones a
document names relative to a directory (the dev data dir) are listed here with the words that
name them, and those words must still be in the document.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ("README.md", "deploy/README.md", "SECURITY.md", "deploy/compose.yaml")
# Directories a checkout has or gets: the committed top level, and what `fencingd dev` makes.
DEV_DATA_DIR = "fencing-dev-data"
# What makes a file name a secret's: the peer credential, the admin token, a private key.
SECRET_NAME = re.compile(r"secret|token|\.pem$|(^|[-_.])key($|[-_.])")
# Source, documents and public keys are no secrets, whatever their names say.
NOT_SECRET_SUFFIXES = (".py", ".md", ".toml", ".yaml", ".yml", ".proto", ".json", ".service", ".pub")
# Secrets the documents name without a path from the repository's root: (document, the words
# that name it there, the path in a checkout).
NAMED_RELATIVELY = (
    ("SECURITY.md", "`fencingd dev` makes its\nown secret (`raft-secret` in its data dir",
     f"{DEV_DATA_DIR}/raft-secret"),
    ("README.md", "its own token-signing key pair and its own peer credential (`raft-secret`)",
     f"{DEV_DATA_DIR}/token-signing.pem"),
    ("README.md", "fencingd keygen --private-key signing.pem --public-key signing.pub", "signing.pem"),
)


def _git(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def _top_level() -> set[str]:
    files = _git("ls-files").stdout.split()
    return {f.split("/", 1)[0] for f in files if "/" in f} | {DEV_DATA_DIR}


def secret_paths_in(text: str, top: set[str]) -> set[str]:
    """Repository paths in ``text`` whose file name is a secret's (public halves aside)."""
    dirs = "|".join(map(re.escape, sorted(top)))
    pattern = re.compile(rf"(?<![\w./-])(?:\./)?((?:{dirs})/[\w.*/-]*[\w*])")
    found = set()
    for match in pattern.finditer(text):
        path = match.group(1)
        name = path.rsplit("/", 1)[1]
        if SECRET_NAME.search(name) and not name.endswith(NOT_SECRET_SUFFIXES) and "*" not in name:
            found.add(path)
    return found


def documented_secrets() -> set[str]:
    top = _top_level()
    paths: set[str] = set()
    for doc in DOCUMENTS:
        with open(os.path.join(REPO, doc), encoding="utf-8") as f:
            paths |= secret_paths_in(f.read(), top)
    return paths


def test_the_scan_finds_what_the_documents_call_secret():
    # The compose secrets: README "Deploy" says they are not committed, compose.yaml makes them.
    assert {"deploy/compose/raft-secret", "deploy/compose/admin-token"} <= documented_secrets()
    top = _top_level()
    # ... and it would find a new one, and leaves public keys and directories alone.
    assert secret_paths_in("mount `deploy/kubernetes/api-key.pem` and deploy/x/y.pub", top) == {
        "deploy/kubernetes/api-key.pem"}
    assert secret_paths_in("see deploy/compose/, tests/test_secret_rotation.py", top) == set()


@pytest.mark.parametrize("doc,words,path", NAMED_RELATIVELY)
def test_each_relatively_named_secret_is_still_named_so(doc, words, path):
    with open(os.path.join(REPO, doc), encoding="utf-8") as f:
        assert words in f.read(), f"{doc} no longer says {words!r}: update NAMED_RELATIVELY"


def test_every_documented_secret_is_git_ignored_and_not_committed():
    paths = sorted(documented_secrets() | {path for _, _, path in NAMED_RELATIVELY})
    # git check-ignore exits 0 and prints the paths it ignores; a tracked file is never ignored.
    ignored = set(_git("check-ignore", *paths).stdout.split())
    missing = [p for p in paths if p not in ignored]
    assert not missing, f"documented as secret but not git-ignored (add them to .gitignore): {missing}"
    tracked = _git("ls-files", "--", *paths).stdout.split()
    assert not tracked, f"secrets committed to the repository: {tracked}"
