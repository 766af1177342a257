"""The docs hold together (issue 23 item 5): the README stays short, the site builds in
strict mode (every page in the nav, every relative link and anchor found), the README's own
links and anchors resolve, the CLI reference is the commands' own help, and every code
block is run somewhere or says why not (docs/development/docs.md). What needs a database
runs in tests/integration/test_doc_examples.py."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import click
import pytest
from cli_reference import PAGE as CLI_PAGE
from cli_reference import render
from doctext import DOCS, README, ROOT, Block, all_blocks, blocks, name_of, pages

from pgworkerd.cli import main
from pgworkerd.config import parse_config

BLOCKS = all_blocks()
LANGS = {"text", "sh", "sql", "python", "toml"}
KINDS = {"skip", "by", "sql", "python", "toml"}


def test_the_readme_stays_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move the detail into docs/"


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    assert mkdocs.exists(), "mkdocs is missing: pip install -e '.[docs]' (deploy/bootstrap --test)"
    proc = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").exists()


# -- links and anchors -------------------------------------------------------------------------


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's toc) makes it; GitHub's agrees for the
    headings these pages use (no runs of punctuation)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def prose(path: Path) -> str:
    """A page without its code blocks and code spans (links there are not links)."""
    lines = path.read_text().split("\n")
    for b in blocks(path):
        end = b.line + b.body.count("\n")
        for n in range(b.line - 1, end + 1):
            lines[n] = ""
    return re.sub(r"`[^`\n]*`", "", "\n".join(lines))


def anchors(path: Path) -> set[str]:
    return {slug(m[1]) for m in re.finditer(r"(?m)^#{1,6} (.+?)\s*$", prose(path))}


LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for path in pages():
        for m in LINK.finditer(prose(path)):
            target = m["target"]
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{name_of(path)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{name_of(path)}: {target} (no such heading)")
            elif path == README and file and not dest.is_relative_to(ROOT):
                broken.append(f"{name_of(path)}: {target} (outside the repository)")
    assert broken == []


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [name_of(p) for p in sorted(DOCS.rglob("*.md")) if name_of(p) not in nav]
    assert missing == []


def test_the_cli_reference_is_the_commands_own_help() -> None:
    assert CLI_PAGE.read_text() == render(), (
        "docs/reference/cli.md is stale: python tests/support/cli_reference.py"
    )


# -- code blocks --------------------------------------------------------------------------------


def test_every_code_block_runs_or_says_why_not() -> None:
    problems = []
    for b in BLOCKS:
        if b.lang not in LANGS:
            problems.append(f"{b.where}: ```{b.lang}: use one of {sorted(LANGS)}")
        elif b.kind is not None and b.kind not in KINDS:
            problems.append(f"{b.where}: unknown marker {b.kind!r}")
        elif b.kind == "skip" and (len(b.marker) < 2 or len(b.marker[1]) < 10):
            problems.append(f"{b.where}: a skip says why")
        elif b.kind is not None and b.kind not in ("skip", "by") and b.kind != b.lang:
            problems.append(f"{b.where}: a {b.kind} marker on a ```{b.lang} block")
        elif b.lang in ("sql", "python") and b.kind is None:
            problems.append(f"{b.where}: a ```{b.lang} block needs a marker")
        elif b.lang == "sh" and b.kind is None and not re.match(r"# as pgworkerd_", b.label):
            problems.append(f"{b.where}: a shell block not run as a role needs a marker")
    assert problems == []


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "by"], ids=lambda b: b.where)
def test_a_block_run_elsewhere_names_a_test_that_exists(block: Block) -> None:
    assert len(block.marker) == 2, f"{block.where}: by PATH::TEST"
    file, _, name = block.marker[1].partition("::")
    tree = ast.parse((ROOT / file).read_text())
    tests = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert name in tests, f"{block.where}: no test {block.marker[1]}"
    source = (ROOT / file).read_text()
    page = name_of(block.path)
    assert page in source or "doctext" in source, f"{file} does not read {page}"


TOML = [b for b in BLOCKS if b.lang == "toml" and b.kind != "skip"]


@pytest.mark.parametrize("block", TOML, ids=[b.where for b in TOML])
def test_toml_example_is_a_valid_config(block: Block) -> None:
    from pgworkerd.web.passwords import hash_password

    text = block.body
    if "hash" in block.options:  # a placeholder for what `hash-password` prints
        assert block.options["hash"] in text
        text = text.replace(block.options["hash"], hash_password("example password"))
    parse_config(text, block.where)


def invocations(block: Block) -> list[list[str]]:
    """Each `pgworkerd ...` command line of a shell block, as words (synopsis brackets and
    alternatives dropped)."""
    found = []
    body = block.body.replace("\\\n", " ")
    for line in body.splitlines():
        line = re.sub(r"\s#.*$", "", line)
        for m in re.finditer(r"(?:^|[\s(|])pgworkerd((?:\s+[^|;)\s]+)*)", line):
            text = m[1].replace("[", " ").replace("]", " ").replace("...", " ")
            try:
                words = shlex.split(text)
            except ValueError:
                words = text.split()
            found.append(words)
    return found


GLOBAL_WITH_VALUE = {"--dsn", "--schema", "--config", "-c"}
SHELL = [b for b in BLOCKS if b.lang == "sh"]


@pytest.mark.parametrize("block", SHELL, ids=[b.where for b in SHELL])
def test_shell_examples_name_real_commands_and_options(block: Block) -> None:
    for words in invocations(block):
        rest = list(words)
        while rest and rest[0].split("=")[0] in GLOBAL_WITH_VALUE:
            rest = rest[1 + ("=" not in rest[0]) :]
        if not rest or rest[0].startswith("-"):
            continue  # `pgworkerd --version`, `pgworkerd --help`
        command: click.Command | None = main.commands.get(rest[0])
        assert command is not None, f"{block.where}: no command `pgworkerd {rest[0]}`"
        rest = rest[1:]
        if isinstance(command, click.Group) and rest and rest[0] in command.commands:
            command = command.commands[rest[0]]
            rest = rest[1:]
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        options |= {"--help", "-h"}
        unknown = [w for w in rest if w.startswith("--") and w.split("=")[0] not in options]
        assert unknown == [], f"{block.where}: `pgworkerd {command.name}` has no {unknown}"


def test_the_docs_tree_has_no_stray_copies() -> None:
    """Each page's source is docs/; a built site is never committed."""
    assert shutil.which("git") is not None
    tracked = subprocess.run(
        ["git", "ls-files", "site"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    assert tracked == ""


def test_the_exit_code_table_is_the_enums() -> None:
    from pgworkerd.exitcodes import RESTART_PREVENTING, ExitCode

    text = (DOCS / "reference" / "exit-codes.md").read_text()
    listed = [int(m[1]) for m in re.finditer(r"(?m)^\| (\d+) \|", text)]
    assert listed == [int(code) for code in ExitCode]
    named = re.search(r"exits with ([\d, and]+) only when restarting cannot help", text)
    assert named is not None
    assert [int(n) for n in re.findall(r"\d+", named[1])] == [int(c) for c in RESTART_PREVENTING]
