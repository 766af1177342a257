"""Packaging: what `pip install` gives a user who has no checkout. The sdist and the wheel
are really built (`python -m build`, which builds the wheel from the sdist) and the wheel
is installed into a throwaway virtualenv."""

from __future__ import annotations

import email
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from pgworkerd.version import __version__

REPO = Path(__file__).resolve().parents[2]
# What a pip-only user needs besides the code, and where the checkout keeps it.
SHIPPED = {
    "config.example.toml": REPO / "config.example.toml",
    "roles.sql": REPO / "deploy" / "roles.sql",
    "pgworkerd.service": REPO / "systemd" / "pgworkerd.service",
    "pgworkerd@.service": REPO / "systemd" / "pgworkerd@.service",
    "pgworkerd-web.service": REPO / "systemd" / "pgworkerd-web.service",
    **{
        name: REPO / "systemd" / name
        for name in (
            "dropin-gpu.conf",
            "dropin-jit.conf",
            "dropin-job-cgroups.conf",
            "dropin-job-uids.conf",
            "dropin-output-dirs.conf",
            "dropin-venv.conf",
        )
    },
}
BUILD_TIMEOUT = 600  # two isolated build environments on a loaded 2-core machine


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, built from a copy of this checkout (so the build's
    egg-info and build/ directories never land in the working tree)."""
    root = tmp_path_factory.mktemp("pkg")
    src = root / "src"
    shutil.copytree(
        REPO,
        src,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "*.egg-info", "__pycache__", "build", "dist", ".pytest_cache"
        ),
    )
    out = root / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def test_wheel_ships_the_deploy_files_and_the_license(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = set(whl.namelist())
        for name, original in SHIPPED.items():
            assert whl.read(f"pgworkerd/files/{name}") == original.read_bytes(), name
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(whl.read(metadata))
        licenses = [n for n in names if "/licenses/" in n]
    # PEP 639: an SPDX expression and the license file itself
    # pyproject.toml's version is dynamic: the build reads pgworkerd/version.py
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["License"] is None  # the deprecated free-text field is gone
    assert [Path(n).name for n in licenses] == ["LICENSE"]
    assert not [n for n in names if n.startswith("tests/")]
    # the connection pool is the dashboard's alone: the daemon's install goes without it
    pool = [r for r in meta.get_all("Requires-Dist") or [] if r.startswith("psycopg-pool")]
    assert pool and all("extra ==" in r for r in pool), pool
    assert any('extra == "web"' in r for r in pool), pool
    # the dashboard's templates and static files (`pgworkerd web` renders nothing without)
    web = Path(__file__).resolve().parents[2] / "pgworkerd" / "web"
    for kind in ("templates", "static"):
        for path in (web / kind).iterdir():
            assert f"pgworkerd/web/{kind}/{path.name}" in names, path


def test_sdist_ships_no_tests_and_the_real_files(dist: dict[str, Path]) -> None:
    """The suite needs the whole checkout (deploy/, bench/, a PostgreSQL server), so the
    sdist carries none of it rather than tests that cannot run."""
    with tarfile.open(dist["sdist"]) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        assert not [n for n in members if n.startswith(("tests/", "bench/"))]
        for name, original in SHIPPED.items():
            member = members[f"pgworkerd/files/{name}"]
            assert member.isfile(), f"{name} is a {member.type!r}, not a regular file"
            data = tar.extractfile(member)
            assert data is not None and data.read() == original.read_bytes(), name
        assert "LICENSE" in members


def test_pip_only_user_gets_the_files_from_the_command(
    dist: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    [target_site] = venv.glob("lib/python*/site-packages")
    # The dependencies come from the test environment (no index needed); its editable
    # pgworkerd is not visible from there (its .pth is only read in its own site dir).
    (target_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-deps", "--no-index", "-q", str(dist["wheel"])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pgworkerd = venv / "bin" / "pgworkerd"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(pgworkerd), *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import pgworkerd; print(pgworkerd.__file__)"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(target_site)), where.stdout
    version = run("--version")
    assert (version.returncode, version.stdout) == (0, f"pgworkerd, version {__version__}\n")

    listing = run("files")
    assert listing.returncode == 0, listing.stderr
    assert [ln.split()[0] for ln in listing.stdout.splitlines()] == sorted(SHIPPED)
    for name, original in SHIPPED.items():
        shown = run("files", name)
        assert (shown.returncode, shown.stdout) == (0, original.read_text()), shown.stderr

    copied = run("files", "--to", str(tmp_path / "etc"))
    assert copied.returncode == 0, copied.stderr
    for name, original in SHIPPED.items():
        assert (tmp_path / "etc" / name).read_bytes() == original.read_bytes()
    (tmp_path / "etc" / "roles.sql").write_text("-- edited by the operator\n")
    again = run("files", "--to", str(tmp_path / "etc"), "roles.sql")
    assert again.returncode == 1
    assert again.stderr.startswith("pgworkerd: ") and "already exists" in again.stderr
    assert (tmp_path / "etc" / "roles.sql").read_text() == "-- edited by the operator\n"

    unknown = run("files", "nope.toml")
    assert unknown.returncode == 2
    assert "roles.sql" in unknown.stderr and "Traceback" not in unknown.stderr
