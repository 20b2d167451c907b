"""Every example in README.md and docs/*.md is checked on the CPU: the docs cannot drift from the code.

What is checked (docs/development.md says the same for doc writers):

* Fenced blocks ```` ```bash ````, ```` ```console ```` (only the lines after ``$ ``) and
  ```` ```python ````. A fence without a language is an output sample and is not checked.
* Shell lines: ``# comments`` dropped, a trailing ``\\`` joins lines, ``;`` ``&&`` ``||`` ``|`` split a
  line into commands. ``qlabench ...`` / ``python -m qlabench ...`` is parsed by the real CLI: the
  (sub)command must exist, every option must be one of its options, every value must pass click's type
  (Choice, IntRange, ...; file existence is not asked of parse-only commands) and, for run / warm /
  gate / compare / history, the suite's own parsers (presets, patterns, sweeps, backends and kernel
  variants, --min-speedup, percentages). ``python -m pytest`` must name existing paths and registered
  markers, ``ruff check`` and ``bash`` existing paths, ``pip`` is left alone; any other program fails
  the test (add it here deliberately).
* Python blocks are executed; a marked one is compiled and its imports must resolve.
* Unmarked ``qlabench`` commands then RUN, in-process (click's CliRunner), in a scratch folder per block
  where ``results/`` is a copy of the repository's (relative paths in the docs resolve; what they write
  stays there), and must exit 0; python blocks run there too.

A marker is an HTML comment on the last non-blank line before the fence:

    <!-- gpu -->                needs a CUDA GPU (or a GPU host's files): parse / compile only
    <!-- slow -->               runs on the CPU but takes minutes: parsed here, run under -m slow
    <!-- parse-only: why -->    must not run in a test (compiles for minutes, writes into results/,
                                needs a process group): parse / compile only

Any other comment right before a fence is an error (a typo would silently run or skip a block).

Besides the blocks: an inline code span that starts with ``qlabench <command>`` must name a real
command and only that command's options; docs/cli.md must have a ``## qlabench <command>`` section for
every command, naming every option of it and no other; relative links between the docs must resolve
(file and #anchor).
"""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from qlabench.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGS = ("bash", "console", "python")
MARKERS = ("gpu", "slow", "parse-only")
_FENCE = re.compile(r"^```\s*([\w-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*([\w-]+)\s*(?::.*)?-->\s*$")
_SEPARATORS = {";", "&&", "||", "|", "&"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    marker: str | None
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_doc(path: Path) -> tuple[list[Block], str, list[str]]:
    """(checked blocks, the text outside every fence, problems: unknown markers, unclosed fences)."""
    lines = path.read_text().splitlines()
    blocks, prose, problems = [], [], []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        start, lang = i, m.group(1)
        prev = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
        marker = None
        if prev.startswith("<!--"):
            mm = _MARKER.match(prev)
            if not mm or mm.group(1) not in MARKERS:
                problems.append(f"{path.name}:{start + 1}: unknown marker {prev!r} (known: {', '.join(MARKERS)})")
            else:
                marker = mm.group(1)
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            problems.append(f"{path.name}:{start + 1}: fence never closed")
        i += 1
        prose.append("")
        if lang in LANGS:
            blocks.append(Block(path, start + 1, lang, marker, "\n".join(body) + "\n"))
        elif marker:
            problems.append(f"{path.name}:{start + 1}: a marker before a block that is not checked ({lang or 'no language'})")
    return blocks, "\n".join(prose), problems


BLOCKS = [b for p in DOCS for b in parse_doc(p)[0]]
SHELL = [b for b in BLOCKS if b.lang in ("bash", "console")]
PYTHON = [b for b in BLOCKS if b.lang == "python"]


# --- shell lines -------------------------------------------------------------------------------------


def shell_commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, each an argv."""
    raw = block.text.splitlines()
    if block.lang == "console":
        raw = [ln[2:] for ln in raw if ln.startswith("$ ")]
    joined, buf = [], ""
    for ln in raw:
        if ln.rstrip().endswith("\\"):
            buf += ln.rstrip()[:-1] + " "
            continue
        joined.append(buf + ln)
        buf = ""
    out = []
    for ln in joined:
        lex = shlex.shlex(ln, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        argv = []
        for tok in lex:
            if tok in _SEPARATORS:
                if argv:
                    out.append(argv)
                argv = []
            elif set(tok) <= set("<>()"):
                raise AssertionError(f"{block.id}: shell syntax {tok!r} in {ln!r}: keep doc commands plain")
            else:
                argv.append(tok)
        if argv:
            out.append(argv)
    return out


def qlabench_args(argv: list[str]) -> list[str] | None:
    """The arguments after ``qlabench`` / ``python -m qlabench``, or None for another program."""
    if argv[0] == "qlabench":
        return argv[1:]
    if argv[:3] in (["python", "-m", "qlabench"], ["python3", "-m", "qlabench"]):
        return argv[3:]
    return None


def _resolve(args: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """(the command, its name path, the arguments left for it)."""
    cmd, names = main, ["qlabench"]
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(click.Context(cmd), args[0])
        if sub is None:
            raise click.UsageError(f"{' '.join(names)} has no command {args[0]!r} "
                                   f"(it has: {', '.join(cmd.list_commands(click.Context(cmd)))})")
        names.append(args[0])
        cmd, args = sub, args[1:]
    return cmd, names, list(args)


def _missing(value) -> bool:
    return value is None or value == () or value == [] or type(value).__name__ in ("Sentinel", "_Sentinel")


def parse_qlabench(args: list[str]) -> tuple[list[str], dict]:
    """Parses ``qlabench ARGS`` as the CLI would, without running it: (command path, converted values).
    Raises click.UsageError / BadParameter / ValueError naming what is wrong."""
    cmd, names, rest = _resolve(args)
    ctx = click.Context(cmd, info_name=names[-1])
    opts, extra, _ = cmd.make_parser(ctx).parse_args(rest)
    if extra:
        raise click.UsageError(f"unexpected extra arguments {extra}")
    if isinstance(cmd, click.Group) and not any(p.is_eager and not _missing(opts.get(p.name))
                                                for p in cmd.get_params(ctx)):
        raise click.UsageError(f"{' '.join(names)} needs a command")
    values = {}
    for param in cmd.get_params(ctx):
        raw = opts.get(param.name)
        if _missing(raw):
            if param.required:
                raise click.MissingParameter(ctx=ctx, param=param)
            continue
        values[param.name] = raw if isinstance(param.type, click.Path) else param.type_cast_value(ctx, raw)
    _check_values(names[1:], values)
    return names, values


def _check_values(path: list[str], v: dict) -> None:
    """The suite's own parsers over what click passes as plain text."""
    from qlabench.backends import parse_backends
    from qlabench.gate import parse_min_speedup, parse_percent
    from qlabench.runsetup import select_cases
    from qlabench.workload import parse_pattern

    if path in (["run"], ["warm"]):
        select_cases(v.get("sweep"), v.get("cfgs", ()), v.get("seqlens", ()), v.get("phase"), v.get("gate_profile"))
        if v.get("backends"):
            parse_backends(v["backends"])
        if v.get("pattern") not in (None, "first", "smallest"):
            parse_pattern(v["pattern"])
    if path == ["gate"]:
        for text in v.get("min_speedups", ()):
            parse_min_speedup(text)
        parse_percent(v.get("max_regression", "5%"))
    if path in (["gate"], ["compare"], ["history"]) and "min_effect" in v:
        parse_percent(v["min_effect"])
    if path == ["baseline", "update"] and v.get("backends"):
        parse_backends(v["backends"])


def check_other_program(argv: list[str]) -> None:
    """Programs other than qlabench that the docs may show; none of them is run."""
    prog = argv[0]
    if argv[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        args = argv[3:]
        known = {m.split(":")[0].strip() for m in _pytest_markers()}
        for i, a in enumerate(args):
            if a == "-m":
                words = set(re.findall(r"[A-Za-z_]\w*", args[i + 1])) - {"and", "or", "not"}
                assert words <= known, f"unknown pytest marker(s) {words - known} (registered: {known})"
            elif not a.startswith("-") and (i == 0 or args[i - 1] != "-m"):
                assert (ROOT / a.split("::")[0]).exists(), f"pytest path {a} does not exist"
        return
    if prog == "pip":
        return
    if prog == "ruff":
        assert argv[1] in ("check", "format"), argv
        for a in argv[2:]:
            assert a.startswith("-") or (ROOT / a).exists(), f"ruff path {a} does not exist"
        return
    if prog == "bash":
        files = [a for a in argv[1:] if not a.startswith("-")]
        assert files and (ROOT / files[0]).is_file(), f"bash: {files[:1]} is not a file of the repository"
        return
    raise AssertionError(f"{prog!r}: a program this test does not know; add a check for it to "
                         "tests/test_docs_examples.py (check_other_program)")


def _pytest_markers() -> list[str]:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["pytest"]["ini_options"]["markers"]


@pytest.fixture(scope="module")
def results_copy(tmp_path_factory):
    """One copy of results/ for the module (5.7 MB; what an example writes there stays in the copy)."""
    d = tmp_path_factory.mktemp("docs-results") / "results"
    shutil.copytree(ROOT / "results", d)
    return d


@pytest.fixture
def scratch(tmp_path, results_copy):
    """The working folder of one block: ``results`` (the module's copy) resolves, and the block's
    own outputs (``runs/...``) do not meet another block's."""
    (tmp_path / "results").symlink_to(results_copy, target_is_directory=True)
    return tmp_path


def _run_qlabench(args: list[str], where: str) -> None:
    res = CliRunner().invoke(main, args)
    if res.exit_code != 0:
        import traceback

        tb = "".join(traceback.format_exception(*res.exc_info)) if res.exc_info and res.exception else ""
        pytest.fail(f"{where}: `qlabench {shlex.join(args)}` exited {res.exit_code}\n{res.output[-3000:]}\n{tb}")


def _check_shell(block: Block, run: bool) -> None:
    cmds = shell_commands(block)
    assert cmds, f"{block.id}: a shell block without a command"
    for argv in cmds:
        where = f"{block.id}: `{shlex.join(argv)}`"
        args = qlabench_args(argv)
        if args is None:
            try:
                check_other_program(argv)
            except AssertionError as exc:
                pytest.fail(f"{where}: {exc}")
            continue
        try:
            parse_qlabench(args)
        except (click.ClickException, ValueError, TypeError) as exc:
            msg = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
            pytest.fail(f"{where}: does not parse: {msg}")
        if run:
            _run_qlabench(args, where)


def _runs_now(block: Block) -> bool:
    return block.marker is None


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("block", SHELL, ids=[b.id for b in SHELL])
def test_shell_example(block, scratch, monkeypatch):
    monkeypatch.chdir(scratch)
    _check_shell(block, run=_runs_now(block))


SLOW_SHELL = [b for b in SHELL if b.marker == "slow"] or [
    pytest.param(None, marks=pytest.mark.skip(reason="no <!-- slow --> block in the docs"))]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("block", SLOW_SHELL, ids=[getattr(b, "id", "none") for b in SLOW_SHELL])
def test_slow_shell_example_runs(block, scratch, monkeypatch):
    monkeypatch.chdir(scratch)
    _check_shell(block, run=True)


# --- python blocks -----------------------------------------------------------------------------------


def check_imports(tree: ast.AST, where: str) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{where}: relative import in a doc example"
            mod = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(mod, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule, or ImportError


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_example(block, scratch, monkeypatch):
    code = compile(block.text, block.id, "exec")
    check_imports(ast.parse(block.text), block.id)
    if block.marker == "slow":
        pytest.fail(f"{block.id}: <!-- slow --> is for shell blocks; a python example must run in seconds")
    if _runs_now(block):
        monkeypatch.chdir(scratch)
        exec(code, {"__name__": "__doc_example__"})  # noqa: S102 - running the docs' examples is the test


# --- the docs as a whole -----------------------------------------------------------------------------


def test_blocks_found_and_markers_known():
    problems = [p for path in DOCS for p in parse_doc(path)[2]]
    assert not problems, "\n".join(problems)
    assert (ROOT / "docs").is_dir() and len(DOCS) > 5
    assert {b.lang for b in BLOCKS} >= {"bash", "python"}
    assert any(b.marker is None for b in SHELL) and any(b.marker == "gpu" for b in SHELL)


def _leaf_commands(cmd=main, names=("qlabench",)):
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(click.Context(cmd)):
            yield from _leaf_commands(cmd.get_command(click.Context(cmd), name), (*names, name))
    else:
        yield names, cmd


def _option_names(cmd) -> set[str]:
    ctx = click.Context(cmd)
    return {o for p in cmd.get_params(ctx) if isinstance(p, click.Option) for o in p.opts + p.secondary_opts
            if o.startswith("--")}


_INLINE = re.compile(r"(?<!`)`(?!`)((?:[^`\n]|\n(?!\s*\n))+?)`(?!`)")
_LONG_OPT = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def test_inline_commands_name_real_commands_and_options():
    bad = []
    for path in DOCS:
        prose = parse_doc(path)[1]
        for m in _INLINE.finditer(prose):
            span = " ".join(m.group(1).split())
            words = span.split(" ")
            args = qlabench_args(words)
            if args is None or not args or args[0].isupper() or args[0].startswith("<"):
                continue  # not a command line, or a placeholder (`qlabench COMMAND [OPTIONS]`)
            line = prose.count("\n", 0, m.start()) + 1
            group = isinstance(main.get_command(click.Context(main), args[0]), click.Group)
            try:
                cmd, names, _ = _resolve(args[:2] if group else args[:1])  # `qlabench baseline update ...`
            except click.UsageError as exc:
                bad.append(f"{path.name}:{line}: `{span}`: {exc.format_message()}")
                continue
            unknown = set(_LONG_OPT.findall(span)) - _option_names(cmd) - {"--help", "--version"}
            if unknown:
                bad.append(f"{path.name}:{line}: `{span}`: {' '.join(names)} has no {', '.join(sorted(unknown))}")
    assert not bad, "\n".join(bad)


def test_cli_md_documents_every_command_and_option():
    prose = parse_doc(ROOT / "docs" / "cli.md")[1]
    sections = dict(re.findall(r"^## qlabench ([^\n]+)\n(.*?)(?=^## |\Z)", prose, re.DOTALL | re.MULTILINE))
    bad = []
    for names, cmd in _leaf_commands():
        title = " ".join(names[1:])
        if title not in sections:
            bad.append(f"docs/cli.md has no section '## qlabench {title}'")
            continue
        text = sections.pop(title)
        named, have = set(_LONG_OPT.findall(text)), _option_names(cmd) - {"--help"}
        if have - named:
            bad.append(f"qlabench {title}: options not in docs/cli.md: {', '.join(sorted(have - named))}")
        if named - have:
            bad.append(f"qlabench {title}: docs/cli.md names options it does not have: {', '.join(sorted(named - have))}")
    bad += [f"docs/cli.md section for a command that does not exist: qlabench {t}" for t in sections]
    assert not bad, "\n".join(bad)


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_relative_links_resolve():
    bad = []
    for path in DOCS:
        prose = parse_doc(path)[1]
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.name}: link to {target}: no such file")
                continue
            if anchor and dest.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", parse_doc(dest)[1], re.MULTILINE)}
                if anchor not in slugs:
                    bad.append(f"{path.name}: link to {target}: no heading with that anchor in {dest.name}")
    assert not bad, "\n".join(bad)


def test_the_checks_catch_what_they_should():
    """The parser refuses what a stale doc would name; the shell splitter finds every command."""
    assert parse_qlabench(["run", "--cfg", "hk2_hv4", "--quick"])[0] == ["qlabench", "run"]
    assert parse_qlabench(["baseline", "update", "RUN.json", "--gpu", "h200"])[0][1:] == ["baseline", "update"]
    for args, why in [
        (["nosuch"], "no command"),
        (["run", "--cfg", "hk2_hv4", "--no-such-option"], "No such option"),
        (["run", "--cfg", "hk2_hv4", "--timer", "sundial"], "sundial"),
        (["run", "--cfg", "hk2_hv4", "--seqlens", "1x0"], "1x0"),
        (["run", "--cfg", "hk2_hv4", "--backends", "qla:cp=sideways"], "sideways"),
        (["run", "--sweep", "no-such-sweep"], "no-such-sweep"),
        (["gate", "a.json", "--min-speedup", "qla>fla"], "qla>fla"),
        (["baseline", "update", "RUN.json"], "gpu"),
        (["baseline"], "needs a command"),
        (["report"], "results"),
        (["list", "everything"], "everything"),
    ]:
        with pytest.raises((click.ClickException, ValueError)) as info:
            parse_qlabench(args)
        exc = info.value
        msg = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        assert why.lower() in msg.lower(), (args, msg)
    block = Block(ROOT / "README.md", 1, "bash", None,
                  "pip install x && qlabench list sweeps  # all\nqlabench warm --sweep a \\\n  --jobs 2; python -m qlabench env\n")
    assert shell_commands(block) == [["pip", "install", "x"], ["qlabench", "list", "sweeps"],
                                     ["qlabench", "warm", "--sweep", "a", "--jobs", "2"], ["python", "-m", "qlabench", "env"]]
    with pytest.raises(AssertionError, match="does not know"):
        check_other_program(["curl", "https://example.com"])
    with pytest.raises(AssertionError, match="marker"):
        check_other_program(["python", "-m", "pytest", "-m", "fast"])
