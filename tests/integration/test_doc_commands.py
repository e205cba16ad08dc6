"""test_doc_commands.py - the shell commands of the documentation run as written.

Every fenced shell block of the repository's documentation (README.md, docs/, policies/,
certs/, lua/ and any other .md outside build/ and tests/data/) is one of three kinds
(docs/testing.md, "Commands in the docs"):

    ```sh                                   runs as written from the repository root after
                                            `make`, with build/gpuguard; here, in a scratch
                                            copy of the tree, and must exit 0
    <!-- cluster -->  then  ```sh           the same against the local control plane
                                            (tests/e2e/test_doc_commands.py)
    <!-- example: REASON -->  then  ```sh   shown, never run: placeholders, a server that runs
                                            until stopped, a registry, ...; REASON says which

`<!-- exit N -->` (or `<!-- cluster, exit N -->`) expects exit status N instead of 0. A
```text block marked `<!-- output -->` right after a block is what that block prints (stdout
and stderr together): a line `...` stands for any number of lines, `...` inside a line for
any text, and runs of blanks compare equal to one blank.

This file finds and runs the blocks that need no cluster; the e2e file imports it."""

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent

SHELL_LANGS = {"sh", "bash", "shell", "console", "zsh"}
# Not documentation: generated output, third-party fixtures, caches.
SKIP_DIRS = {"build", ".git", ".pytest_cache", "__pycache__", "node_modules"}
SKIP_PREFIXES = [("tests", "data")]
BLOCK_TIMEOUT = 120          # seconds, one block without a cluster
FENCE = re.compile(r"^( *)(`{3,})(.*)$")
MARKER = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    """One fenced block: where it is, its language, its marker and its text."""
    path: Path
    line: int                      # the opening fence's line, 1-based
    lang: str
    marker: str | None             # the text of the comment right above the fence
    text: str
    output: "Block | None" = None  # the ```text block marked `output` that follows it

    @property
    def where(self):
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def words(self):
        """The marker's items: `cluster`, `exit N`, `example: ...`, `output`."""
        if not self.marker:
            return []
        if self.marker.startswith("example"):
            return [self.marker]
        return [w.strip() for w in self.marker.split(",") if w.strip()]

    @property
    def example(self):
        return any(w.startswith("example") for w in self.words)

    @property
    def reason(self):
        for w in self.words:
            if w.startswith("example"):
                return w[len("example"):].lstrip(":").strip()
        return ""

    @property
    def cluster(self):
        return "cluster" in self.words

    @property
    def exit_status(self):
        for w in self.words:
            m = re.fullmatch(r"exit (\d+)", w)
            if m:
                return int(m.group(1))
        return 0

    @property
    def runnable(self):
        return self.lang in SHELL_LANGS and not self.example


def doc_files(root=REPO):
    """Every .md of the repository that is documentation, in a stable order."""
    found = []
    for path in sorted(root.rglob("*.md")):
        rel = path.relative_to(root).parts
        if any(p in SKIP_DIRS for p in rel[:-1]):
            continue
        if any(rel[:len(pre)] == pre for pre in SKIP_PREFIXES):
            continue
        found.append(path)
    return found


def parse(path):
    """The fenced blocks of one file, with their markers and the output blocks they own."""
    lines = path.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, info = m.group(1), m.group(2), m.group(3).strip()
        start = i
        body = []
        i += 1
        while i < len(lines):
            close = FENCE.match(lines[i])
            if close and close.group(2).startswith(ticks) and not close.group(3).strip():
                break
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        marker = None
        j = start - 1
        if j >= 0:
            mm = MARKER.match(lines[j])
            if mm:
                marker = mm.group(1)
        lang = info.split()[0] if info else ""
        blocks.append(Block(path, start + 1, lang, marker, "\n".join(body) + "\n"))
    # An output block belongs to the block before it.
    for prev, cur in zip(blocks, blocks[1:]):
        if cur.marker == "output":
            prev.output = cur
    return blocks


def all_blocks(root=REPO):
    blocks = []
    for path in doc_files(root):
        blocks.extend(parse(path))
    return blocks


def problems(block):
    """What breaks the convention in one block (an empty list when nothing does)."""
    out = []
    for w in block.words:
        if not (w in ("cluster", "output") or w.startswith("example")
                or re.fullmatch(r"exit \d+", w)):
            out.append(f"unknown marker item {w!r}")
    if block.lang in SHELL_LANGS:
        if block.lang != "sh" and not block.example:
            out.append(f"```{block.lang} is run only as ```sh; mark it `<!-- example: why -->`")
        if block.example and not block.reason:
            out.append("`<!-- example -->` needs the reason: `<!-- example: placeholders -->`")
        if block.example and (block.cluster or block.exit_status):
            out.append("an example is never run: `cluster` and `exit N` mean nothing on it")
        if "output" in block.words:
            out.append("`output` marks the ```text block after a command block")
        if not block.example and re.search(r"<[a-z][a-z0-9._/-]*>", block.text):
            out.append("a <placeholder> in a block that runs: mark it an example")
    elif block.marker == "output":
        if block.lang != "text":
            out.append("an output block is ```text")
    else:
        if block.marker is not None:
            out.append(f"a marker on a ```{block.lang or '(plain)'} block means nothing")
        if any(line.startswith("$ ") for line in block.text.splitlines()):
            out.append("shell commands with a `$ ` prompt go in ```sh (or an example)")
    return out


def scratch_tree(dest, binary, tools=None):
    """A copy of the working tree under dest, as after `make`: build/gpuguard is binary."""
    def ignore(dirpath, names):
        rel = Path(dirpath).relative_to(REPO)
        skip = {n for n in names if n in SKIP_DIRS}
        if rel == Path("certs"):
            skip.add("dev")
        if rel == Path("tests/fuzz"):
            skip.add("corpus")
        return skip
    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    (dest / "build").mkdir()
    os.symlink(binary, dest / "build" / "gpuguard")
    if tools:
        (dest / "build" / "tests").mkdir()
        os.symlink(tools, dest / "build" / "tests" / "tools")
    return dest


def no_gpuguard_on_path(dirpath):
    """A `gpuguard` first on PATH that fails: the docs say build/gpuguard."""
    dirpath.mkdir(parents=True, exist_ok=True)
    shim = dirpath / "gpuguard"
    shim.write_text("#!/bin/sh\n"
                    "echo 'gpuguard is not on PATH here: the docs say build/gpuguard' >&2\n"
                    "exit 127\n")
    shim.chmod(0o755)
    return dirpath


def run_block(block, cwd, env, timeout=BLOCK_TIMEOUT):
    """The block through bash -e -o pipefail in cwd: (exit status, stdout and stderr)."""
    try:
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=cwd,
                              env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout, text=True,
                              errors="replace")
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{block.where}: still running after {timeout} s\n{out[-4000:]}")
    return proc.returncode, proc.stdout


def _norm(line):
    return " ".join(line.split())


def _line_matches(want, got):
    if "..." not in want:
        return _norm(want) == _norm(got)
    parts = [re.escape(_norm(p)) for p in want.split("...")]
    return re.fullmatch(r".*".join(parts), _norm(got)) is not None


def output_matches(expected, actual):
    """Whether actual (text) is what expected shows: a `...` line stands for any lines, `...`
    in a line for any text; blanks compare as one; leading and trailing blank lines ignored."""
    want = expected.strip("\n").splitlines()
    got = actual.strip("\n").splitlines()

    memo = {}

    def match(i, j):
        key = (i, j)
        if key in memo:
            return memo[key]
        if i == len(want):
            r = j == len(got)
        elif want[i].strip() == "...":
            r = match(i + 1, j) or (j < len(got) and match(i, j + 1))
        else:
            r = j < len(got) and _line_matches(want[i], got[j]) and match(i + 1, j + 1)
        memo[key] = r
        return r

    return match(0, 0)


def check_block(block, cwd, env, timeout=BLOCK_TIMEOUT):
    """Run one block; fail with what it printed when its status or output is not the doc's."""
    status, out = run_block(block, cwd, env, timeout)
    if status != block.exit_status:
        pytest.fail(f"{block.where}: exit status {status}, the doc expects {block.exit_status}\n"
                    f"--- block\n{block.text}--- printed\n{out[-6000:]}")
    if block.output is not None and not output_matches(block.output.text, out):
        pytest.fail(f"{block.where}: prints something else than {block.output.where} shows\n"
                    f"--- shown\n{block.output.text}--- printed\n{out[-6000:]}")
    return out


def block_env(home, shim_dir, extra_path=()):
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "GPUGUARD_BIN", "GPUGUARD_TOOLS", "GPUGUARD_CLUSTER")}
    env["HOME"] = str(home)
    env["TMPDIR"] = str(home)
    env["PATH"] = os.pathsep.join([str(shim_dir), *map(str, extra_path),
                                   "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin",
                                   "/sbin", "/bin"])
    env["LC_ALL"] = "C.UTF-8"
    env.pop("NO_COLOR", None)
    return env


# ------------------------------------------------------------------ the tests

BLOCKS = all_blocks()
LOCAL = [b for b in BLOCKS if b.runnable and not b.cluster]


def test_the_docs_have_shell_blocks_of_each_kind():
    """The collection itself: a convention nobody uses would test nothing."""
    shell = [b for b in BLOCKS if b.lang in SHELL_LANGS]
    assert LOCAL, "no runnable block found"
    assert [b for b in shell if b.cluster], "no cluster block found"
    assert [b for b in shell if b.example], "no example block found"
    assert [b for b in BLOCKS if b.output is not None], "no output block found"


def test_every_block_follows_the_convention():
    bad = [f"{b.where}: {p}" for b in BLOCKS for p in problems(b)]
    assert not bad, "\n".join(bad)


def test_output_blocks_follow_a_command():
    orphans = [b.where for b in BLOCKS if b.marker == "output"
               and not any(o.output is b for o in BLOCKS)]
    assert not orphans, f"output blocks after no command block: {orphans}"
    of_examples = [b.where for b in BLOCKS if b.output is not None and not b.runnable]
    assert not of_examples, f"output shown for blocks that are never run: {of_examples}"


@pytest.fixture
def scratch(tmp_path):
    binary = os.environ.get("GPUGUARD_BIN")
    if not binary:
        pytest.skip("GPUGUARD_BIN is not set: run through 'make test'")
    tools = os.environ.get("GPUGUARD_TOOLS")
    tree = scratch_tree(tmp_path / "repo", binary, tools)
    home = tmp_path / "home"
    home.mkdir()
    env = block_env(home, no_gpuguard_on_path(tmp_path / "shim"))
    return tree, env


@pytest.mark.parametrize("block", LOCAL, ids=[b.where for b in LOCAL])
def test_runnable_block(block, scratch):
    tree, env = scratch
    if "build/tests/tools/" in block.text and not (tree / "build" / "tests" / "tools").exists():
        pytest.skip("GPUGUARD_TOOLS is not set")
    check_block(block, tree, env)


# ------------------------------------------------------------------ the checker's own tests


def _fake(text, marker=None, lang="sh"):
    return Block(REPO / "README.md", 1, lang, marker, text)


def test_a_wrong_command_fails(scratch):
    """The runner fails a block that does not do what the doc says."""
    tree, env = scratch
    with pytest.raises(pytest.fail.Exception, match="exit status 2, the doc expects 0"):
        check_block(_fake("build/gpuguard check --no-such-flag deploy/gpuguard.yaml\n"), tree, env)
    with pytest.raises(pytest.fail.Exception, match="exit status 127"):
        check_block(_fake("gpuguard version\n"), tree, env)   # not on PATH: build/gpuguard
    block = _fake("build/gpuguard version\n")
    block.output = _fake("gpuguard 0.0.0-not-this\n", "output", "text")
    with pytest.raises(pytest.fail.Exception, match="prints something else"):
        check_block(block, tree, env)


def test_output_matching():
    assert output_matches("a\n...\nz\n", "a\nb\nc\nz\n")
    assert output_matches("a\n...\nz\n", "a\nz\n")
    assert output_matches("x ... y\n", "x 1 2 3 y\n")
    assert output_matches("A   B\n", "A B\n")
    assert not output_matches("a\nz\n", "a\nb\nz\n")
    assert not output_matches("x ... y\n", "x 1 2 3\n")


def test_the_convention_is_enforced():
    assert problems(_fake("make run\n", "example"))
    assert problems(_fake("make run\n", "example: runs until stopped", "console")) == []
    assert problems(_fake("ls\n", "exmaple: typo"))
    assert problems(_fake("ls\n", None, "bash"))
    assert problems(_fake("$ ls\nfoo\n", None, ""))
    assert problems(_fake("ls\n", "example: x")) == []
    assert problems(_fake("ls\n", "cluster, exit 1")) == []
    assert problems(_fake("build/gpuguard check <manifest-dir>/\n"))
    assert problems(_fake("ls\n", "output"))
    assert problems(_fake("a: 1\n", "cluster", "yaml"))


# ------------------------------------------------------------------ links between the pages

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading: lowercase, punctuation dropped, blanks as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def prose(path):
    """The lines of a page outside its fenced blocks, with their numbers."""
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield n, line


def test_links_between_the_pages_resolve():
    """A relative link names a file that exists and, after #, a heading it has."""
    bad = []
    for page in doc_files():
        for n, line in prose(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                if not dest.exists():
                    bad.append(f"{page.relative_to(REPO)}:{n}: {target}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    bad.append(f"{page.relative_to(REPO)}:{n}: {target}: no such heading")
    assert not bad, "\n".join(bad)


def test_the_link_check_can_fail(tmp_path):
    assert slug("The end-to-end tests: `make e2e`") == "the-end-to-end-tests-make-e2e"
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A part\n")
    assert "a-part" in anchors(page) and "no-part" not in anchors(page)
