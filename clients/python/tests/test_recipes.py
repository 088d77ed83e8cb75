"""docs/recipes.md, checked without a cluster.

- Every ```python block compiles, and every name it takes from the package
  (``fencelock.X``, ``from fencelock import X``) exists. Attributes and
  calls on values whose class the block makes plain (``client =
  fencelock.Client(...)``, ``with client.lock(...) as lock``, ``except
  fencelock.Held as held``, ...) are checked against that class: the
  attribute exists, and the call's arguments bind to its signature.
- Every ``fencelock SUBCOMMAND`` in a ```sh block is a subcommand of the
  CLI, and each of its ``--flags`` is in that subcommand's ``--help``;
  every ``fencelockd`` flag is in ``fencelockd --help``. So is every
  ``--flag`` the prose quotes. The binaries are ``$FENCELOCKD`` (as
  tests/harness.py finds it) and the ``fencelock`` beside it.

The Rust blocks are doctests of fencelock-client-async
(``cargo test -p fencelock-client-async --doc``).
"""

import ast
import functools
import inspect
import re
import shlex
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

import fencelock
from fencelock.lock import LockContext
from harness import REPO_ROOT, fencelockd_binary

RECIPES = REPO_ROOT / "docs" / "recipes.md"

# What a method of a class returns, for the names a recipe binds to it.
RETURNS = {
    (fencelock.Client, "lock"): LockContext,
    (fencelock.Client, "acquire"): fencelock.Lock,
    (fencelock.Client, "acquire_raw"): fencelock.Grant,
    (fencelock.Client, "lock_shared"): LockContext,
    (fencelock.Client, "acquire_shared"): fencelock.Lock,
    (fencelock.Client, "acquire_shared_raw"): fencelock.Grant,
    (fencelock.Client, "get"): fencelock.LockInfo,
    (fencelock.Client, "status"): fencelock.NodeStatus,
    (fencelock.Client, "campaign"): fencelock.Lock,
    (fencelock.Client, "watch"): fencelock.Watch,
    (fencelock.Client, "observe"): fencelock.Observer,
    (fencelock.Watch, "next"): fencelock.WatchBatch,
    (fencelock.Observer, "next"): fencelock.LeaderChange,
}
# What `with X as name` binds, by the class of X.
ENTERS = {LockContext: fencelock.Lock, fencelock.Lock: fencelock.Lock, fencelock.Client: fencelock.Client}


def blocks(language: str) -> List[Tuple[int, str]]:
    """(line, source) of each fenced block whose info string starts with
    `language` (`rust,no_run` is a rust block)."""
    text = RECIPES.read_text()
    found = []
    for match in re.finditer(r"^```([^\n]*)\n(.*?)^```$", text, re.M | re.S):
        if re.split(r"[,\s]", match.group(1).strip())[0] == language:
            found.append((text.count("\n", 0, match.start()) + 2, match.group(2)))
    return found


def test_the_recipes_have_blocks_of_every_kind():
    # A parser that found nothing would pass every other test.
    for language, least in [("python", 7), ("rust", 7), ("sh", 5)]:
        assert len(blocks(language)) >= least, f"docs/recipes.md: fewer than {least} ```{language} blocks"


# -- Python ------------------------------------------------------------------


@pytest.mark.parametrize("line,source", blocks("python"))
def test_a_python_block_compiles(line, source):
    compile(source, f"docs/recipes.md:{line}", "exec")


@functools.lru_cache(maxsize=None)
def members(cls: type) -> Set[str]:
    """What an instance of `cls` has: its class's names, dataclass fields,
    and the `self.X = ...` of the package's own classes."""
    names = set(dir(cls)) | set(getattr(cls, "__dataclass_fields__", {}))
    for klass in cls.__mro__:
        if klass.__module__.startswith("fencelock"):
            names |= set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=(?!=)", inspect.getsource(klass)))
    return names


class Checker(ast.NodeVisitor):
    """Resolves package names and, where a block makes it plain, the class
    of a variable; collects what does not exist or does not bind."""

    def __init__(self) -> None:
        self.modules: Set[str] = set()  # names bound to the package
        self.types: Dict[str, type] = {}  # variable -> class
        self.problems: List[str] = []

    def problem(self, node: ast.AST, what: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    # Bindings -----------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "fencelock":
                self.modules.add(alias.asname or "fencelock")
            elif alias.name.startswith("fencelock."):
                self.problem(node, f"import {alias.name}: recipes use the package's top-level names")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module != "fencelock":
            if (node.module or "").startswith("fencelock"):
                self.problem(node, f"from {node.module} import ...: recipes use the package's top-level names")
            return
        for alias in node.names:
            if not hasattr(fencelock, alias.name):
                self.problem(node, f"fencelock has no {alias.name}")
            elif isinstance(getattr(fencelock, alias.name), type):
                self.types[alias.asname or alias.name] = ClassName(getattr(fencelock, alias.name))

    def class_of(self, node: Optional[ast.AST]) -> Optional[type]:
        """The class of the value of `node`, if the block makes it plain."""
        if isinstance(node, ast.Call):
            made = self.named_class(node.func)
            if made is not None:
                return made
            if isinstance(node.func, ast.Attribute):
                owner = self.class_of(node.func.value)
                return RETURNS.get((owner, node.func.attr)) if owner is not None else None
        if isinstance(node, ast.Name):
            known = self.types.get(node.id)
            return None if isinstance(known, ClassName) else known
        return None

    def named_class(self, node: ast.AST) -> Optional[type]:
        """The package class that `node` names (`fencelock.Client`, or an
        imported `Client`)."""
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.modules:
            value = getattr(fencelock, node.attr, None)
            return value if isinstance(value, type) else None
        if isinstance(node, ast.Name) and isinstance(self.types.get(node.id), ClassName):
            return self.types[node.id].cls
        return None

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        cls = self.class_of(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name) and cls is not None:
                self.types[target.id] = cls

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            entered = ENTERS.get(self.class_of(item.context_expr))
            if isinstance(item.optional_vars, ast.Name) and entered is not None:
                self.types[item.optional_vars.id] = entered
        for statement in node.body:
            self.visit(statement)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
            caught = self.named_class(node.type)
            if node.name and caught is not None:
                self.types[node.name] = caught
        for statement in node.body:
            self.visit(statement)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        # A lambda's parameters are not the variables of the same names.
        saved = dict(self.types)
        for arg in node.args.args:
            self.types.pop(arg.arg, None)
        self.visit(node.body)
        self.types = saved

    # Uses ---------------------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id in self.modules:
            if not hasattr(fencelock, node.attr):
                self.problem(node, f"fencelock has no {node.attr}")
            return
        cls = self.class_of(node.value)
        if cls is not None and node.attr not in members(cls):
            self.problem(node, f"{cls.__name__} has no {node.attr}")

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(k.arg is None for k in node.keywords):
            return
        target, what = self.named_class(node.func), None
        if target is not None:
            what = target.__name__
        elif isinstance(node.func, ast.Attribute):
            owner = self.class_of(node.func.value)
            method = getattr(owner, node.func.attr, None) if owner is not None else None
            if callable(method):
                # Bound to a placeholder instance: the signature without self.
                target, what = method.__get__(object()), f"{owner.__name__}.{node.func.attr}"
        if target is None:
            return
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return
        try:
            signature.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as err:
            self.problem(node, f"{what}{signature}: {err}")


class ClassName:
    """A package class bound to a plain name (`from fencelock import
    Client`), as opposed to an instance of it."""

    def __init__(self, cls: type) -> None:
        self.cls = cls


@pytest.mark.parametrize("line,source", blocks("python"))
def test_a_python_block_uses_only_what_the_package_has(line, source):
    checker = Checker()
    checker.visit(ast.parse(source))
    assert checker.modules or checker.types, f"docs/recipes.md:{line}: the block does not use fencelock"
    assert not checker.problems, f"docs/recipes.md:{line}: " + "; ".join(checker.problems)


def test_the_python_checker_catches_what_does_not_exist():
    checker = Checker()
    checker.visit(ast.parse(
        "import fencelock\nfrom fencelock import Nope\n"
        "client = fencelock.Client(['h:1'], ownr='x')\n"
        "with client.lock('k', ttl=1, on_lost=print) as lock:\n    lock.tokn\n    lock.time_left(3)\n"
        "try:\n    client.acquire_raw('k', 1).existing\nexcept fencelock.Delayed as delayed:\n    delayed.lft\n"
        "fencelock.Helt\n"
    ))
    found = " ".join(checker.problems)
    expected_problems = ["no Nope", "ownr", "Lock has no tokn", "Lock.time_left", "Delayed has no lft", "no Helt"]
    for expected in expected_problems:
        assert expected in found, (expected, checker.problems)
    assert len(checker.problems) == 6, checker.problems


# -- The command line -------------------------------------------------------


def binary(name: str) -> Path:
    path = fencelockd_binary()
    if name != "fencelockd":
        path = path.parent / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build --bins` ($FENCELOCKD names fencelockd; "
                    f"the fencelock CLI is taken from beside it)")
    return path


@functools.lru_cache(maxsize=None)
def help_text(program: str, path: Tuple[str, ...]) -> str:
    result = subprocess.run([str(binary(program)), *path, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"{program} {' '.join(path)} --help failed: {result.stderr}"
    return result.stdout


def subcommands(program: str, path: Tuple[str, ...]) -> Set[str]:
    """The subcommands `program PATH --help` lists (none for a leaf)."""
    text = help_text(program, path)
    listed = re.search(r"^Commands:\n(.*?)(?:\n\n|\Z)", text, re.M | re.S)
    return set(re.findall(r"^  (\S+)", listed.group(1), re.M)) - {"help"} if listed else set()


def has_flag(text: str, flag: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", text) is not None


SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "--"}


def invocations(source: str) -> List[Tuple[str, List[str]]]:
    """(program, arguments) of every fencelock or fencelockd run in a shell
    block; the arguments end at `--` (the command `lock` runs) or at the end
    of the command."""
    found = []
    for line in source.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            program = token.rsplit("/", 1)[-1]
            if program in ("fencelock", "fencelockd") and (i == 0 or tokens[i - 1] in SEPARATORS | {"do", "then"}
                                                           or "=" in tokens[i - 1]):
                args = []
                for arg in tokens[i + 1:]:
                    if arg in SEPARATORS:
                        break
                    args.append(arg)
                found.append((program, args))
    return found


def check_invocation(program: str, args: List[str]) -> List[str]:
    """What is wrong with `program ARGS`: an unknown subcommand or flag."""
    path: Tuple[str, ...] = ()
    if program == "fencelock":
        for arg in args:
            if arg in subcommands(program, path):
                path += (arg,)
        if not path:
            return [f"fencelock {' '.join(args)}: no subcommand of fencelock"]
        if subcommands(program, path):
            return [f"fencelock {' '.join(args)}: `{' '.join(path)}` needs a subcommand"]
    text = help_text(program, path)
    return [
        f"{' '.join((program, *path))}: {flag} is not in its --help"
        for flag in (arg.split("=", 1)[0] for arg in args if arg.startswith("--"))
        if not has_flag(text, flag)
    ]


def test_every_shell_block_runs_fencelock_with_real_subcommands_and_flags():
    problems, runs = [], 0
    for line, source in blocks("sh"):
        for program, args in invocations(source):
            runs += 1
            problems += [f"docs/recipes.md:{line}: {p}" for p in check_invocation(program, args)]
    assert runs >= 10, "the shell blocks run fencelock fewer times than the recipes do"
    assert not problems, "\n".join(problems)


def test_the_cli_checker_catches_what_does_not_exist():
    found = invocations("while true; do\n  X=1 fencelock lock k --ttl 1s --frob -- ./job --nope\ndone\n"
                        "fencelock campaign k  # --comment\nfencelockd --lock-delay jobs/=1s \\\n  --nope-d\n")
    assert found == [("fencelock", ["lock", "k", "--ttl", "1s", "--frob"]), ("fencelock", ["campaign", "k"]),
                     ("fencelockd", ["--lock-delay", "jobs/=1s", "--nope-d"])], found
    problems = [p for program, args in found for p in check_invocation(program, args)]
    assert len(problems) == 3 and "--frob" in problems[0] and "no subcommand" in problems[1] \
        and "--nope-d" in problems[2], problems


def test_every_flag_the_prose_names_exists():
    # Flags in `inline code` outside the blocks, such as `--wait 0s`
    # (not those of a `cargo ...` command).
    text = re.sub(r"^```.*?^```$", "", RECIPES.read_text(), flags=re.M | re.S)
    everything = help_text("fencelockd", ())
    pending = [()]
    while pending:
        path = pending.pop()
        everything += help_text("fencelock", path)
        pending += [path + (sub,) for sub in subcommands("fencelock", path)]
    spans = [span for span in re.findall(r"`([^`\n]+)`", text) if not span.startswith("cargo ")]
    flags = {flag for span in spans for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", span)}
    assert flags, "the prose names no flags"
    missing = sorted(flag for flag in flags if not has_flag(everything, flag))
    assert not missing, f"docs/recipes.md names flags that neither fencelock nor fencelockd has: {missing}"
