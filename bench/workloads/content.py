"""Synthetic content for the workloads: source files, READMEs, listings, searches, test runs.

Everything comes from a seeded ``random.Random`` and the fixed word lists below, so the
same seed always gives the same text; no text is copied from anywhere. The texts only
need to look like what a coding agent reads (names that recur, code that parses by eye,
test output with a failure in it), not to make sense as a program.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

NOUNS = (
    "ledger", "cache", "slot", "token", "buffer", "record", "parser", "router", "queue",
    "budget", "profile", "stream", "chunk", "window", "index", "segment", "batch", "entry",
    "session", "worker", "digest", "cursor", "frame", "schema", "policy", "report",
)  # fmt: skip
VERBS = (
    "load", "parse", "flush", "merge", "split", "render", "check", "count", "resolve",
    "apply", "collect", "encode", "decode", "drain", "trim", "restore", "verify", "format",
)  # fmt: skip
# past participles where adding "ed" to the verb is not one
IRREGULAR = {
    "split": "split",
    "apply": "applied",
    "verify": "verified",
    "trim": "trimmed",
    "format": "formatted",
}
ADJECTIVES = (
    "pending", "stale", "local", "remote", "partial", "cached", "active", "broken", "empty",
    "final", "shared", "nested", "ordered", "bounded", "idle", "spare",
)  # fmt: skip
PROJECTS = ("tallyhall", "brookline", "quillmark", "ferrydock", "lanternpy", "copperleaf")
IMPORTS = ("json", "logging", "os", "re", "time", "itertools", "functools", "heapq")
EXCEPTIONS = ("ValueError", "KeyError", "RuntimeError", "LookupError")
# sentence templates for docstrings, READMEs, prompts and summaries: {a} adjective,
# {n}/{m} nouns, {v} a verb, {vd}/{wd} past participles
SENTENCES = (
    "Each {n} is {vd} once, before any {m} reads it.",
    "A {a} {n} is never {vd} twice; the second attempt returns the first result.",
    "The {n} keeps its {m} in insertion order so that a restart can {v} it again.",
    "When the {m} is {a}, the {n} is {vd} lazily on first use.",
    "Callers {v} the {n} through this module only; nothing else writes it.",
    "The {m} limit applies per {n}, not per process.",
    "A {n} that cannot be {vd} is reported with its {m} and skipped.",
    "Timing of each {n} is recorded so that a slow {m} can be found later.",
    "The {a} {m} is dropped after the {n} has been {wd}.",
    "Tests {v} a {n} with a fake {m} and check what was {wd}.",
)
_AN = re.compile(r"\b([Aa]) ([aeiou])")
TEST_FAILURES = (
    ("assert {x} == {y}", "AssertionError"),
    ("assert {n}.{a} is False", "AssertionError"),
    ("{exc}: '{n}_{x}'", "{exc}"),
)


@dataclass(frozen=True, slots=True)
class Repo:
    """The synthetic repository a workload works on: its name and files."""

    name: str
    package: str
    modules: tuple[str, ...]  # module names, without .py
    tests: tuple[str, ...]  # test file names, without .py


def make_repo(rng: random.Random) -> Repo:
    name = rng.choice(PROJECTS)
    nouns = rng.sample(NOUNS, 7)
    return Repo(
        name=name,
        package=name.replace("-", "_"),
        modules=tuple(nouns[:5]),
        tests=tuple(f"test_{n}" for n in nouns[:4]),
    )


def past(verb: str) -> str:
    """``loaded``, ``parsed``, ``applied``, ``split``."""
    if verb in IRREGULAR:
        return IRREGULAR[verb]
    return verb + ("d" if verb.endswith("e") else "ed")


def sentence(rng: random.Random) -> str:
    n, m = rng.sample(NOUNS, 2)
    v, w = rng.sample(VERBS, 2)
    text = rng.choice(SENTENCES).format(
        a=rng.choice(ADJECTIVES), n=n, m=m, v=v, vd=past(v), wd=past(w)
    )
    return _AN.sub(r"\1n \2", text)


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(sentences))


def _function(rng: random.Random, module: str) -> str:
    verb, noun, other = rng.choice(VERBS), rng.choice(NOUNS), rng.choice(NOUNS)
    adj = rng.choice(ADJECTIVES)
    limit = rng.randint(2, 64)
    name = f"{verb}_{noun}"
    bodies = (
        f"    total = 0\n    for item in {noun}s:\n        if item.{adj}:\n            continue\n"
        f"        total += item.size\n        if total > {limit}:\n            break\n"
        f"    return total\n",
        f"    seen: dict[str, int] = {{}}\n    for item in {noun}s:\n"
        f"        seen[item.key] = seen.get(item.key, 0) + 1\n"
        f"    return sum(1 for n in seen.values() if n > {limit % 5 + 1})\n",
        f"    if not {noun}s:\n        raise {rng.choice(EXCEPTIONS)}('no {noun} to {verb}')\n"
        f"    first = {noun}s[0]\n    if first.{adj}:\n        return 0\n"
        f"    return min(len({noun}s), {limit})\n",
        f"    kept = [item for item in {noun}s if not item.{adj}]\n"
        f"    kept.sort(key=lambda item: item.{other}_id)\n    return len(kept[:{limit}])\n",
    )
    doc = sentence(rng)
    return (
        f"def {name}({noun}s: list[{module.title()}Entry]) -> int:\n"
        f'    """{doc}"""\n' + rng.choice(bodies)
    )


def source_file(rng: random.Random, repo: Repo, module: str, target_chars: int) -> str:
    """A Python module of about ``target_chars`` (never more than ``target_chars + 400``)."""
    fields = rng.sample(NOUNS, 3)
    head = (
        f'"""{module.title()} handling for {repo.name}. {sentence(rng)}"""\n\n'
        "from __future__ import annotations\n\n"
        f"import {rng.choice(IMPORTS)}\nfrom dataclasses import dataclass\n\n"
        f"{module.upper()}_LIMIT = {rng.randint(8, 4096)}\n\n\n"
        f"@dataclass\nclass {module.title()}Entry:\n"
        f'    """{sentence(rng)}"""\n\n    key: str\n    size: int = 0\n'
        + "".join(f"    {f}_id: int = 0\n" for f in fields)
        + f"    {rng.choice(ADJECTIVES)}: bool = False\n"
    )
    parts = [head]
    while sum(map(len, parts)) < target_chars:
        parts.append("\n\n" + _function(rng, module))
    return "".join(parts)


def test_file(
    rng: random.Random, repo: Repo, module: str, target_chars: int, first: str | None = None
) -> str:
    """A pytest module for ``module`` of about ``target_chars``; its first test named ``first``
    (``test_<verb>_<module>``) if given."""
    parts = [
        f'"""Tests of {repo.package}.{module}."""\n\n'
        f"from {repo.package}.{module} import {module.title()}Entry\n"
    ]
    while sum(map(len, parts)) < target_chars:
        verb, adj = rng.choice(VERBS), rng.choice(ADJECTIVES)
        name = f"test_{verb}_{adj}_{module}"
        if first is not None and len(parts) == 1:
            name = first
        a, b = rng.randint(0, 9), rng.randint(1, 40)
        parts.append(
            f"\n\ndef {name}() -> None:\n"
            f"    entries = [{module.title()}Entry(key=str(i), size={b}) for i in range({a})]\n"
            f"    entries[0].{adj} = True if entries else False\n"
            f"    assert len(entries) == {a}\n"
        )
    return "".join(parts)


def readme(rng: random.Random, repo: Repo, target_chars: int) -> str:
    """The repository's README of about ``target_chars``."""
    text = (
        f"# {repo.name}\n\n{paragraph(rng, 3)}\n\n## Usage\n\n```sh\n"
        f"pip install -e .\npython -m {repo.package} --{rng.choice(VERBS)} "
        f"{rng.choice(NOUNS)}s.json\n```\n\n## Layout\n\n"
        + "".join(f"- `src/{repo.package}/{m}.py`: {sentence(rng)}\n" for m in repo.modules)
        + "\n## Development\n\n"
    )
    while len(text) < target_chars:
        text += paragraph(rng, 2) + "\n\n"
    return text


def listing(rng: random.Random, repo: Repo) -> str:
    """``list_dir`` output of the package: one file a line with its size."""
    lines = [f"src/{repo.package}/__init__.py  {rng.randint(40, 200)} B"]
    lines += [f"src/{repo.package}/{m}.py  {rng.randint(900, 9000)} B" for m in repo.modules]
    lines += [f"tests/{t}.py  {rng.randint(600, 5000)} B" for t in repo.tests]
    lines += [f"README.md  {rng.randint(1500, 4000)} B", "pyproject.toml  612 B"]
    return "\n".join(lines)


def search_result(rng: random.Random, repo: Repo, word: str) -> str:
    """``search`` output: ``path:line: text`` for a few matches of ``word``."""
    hits = []
    for module in rng.sample(repo.modules, 3):
        line = rng.randint(10, 180)
        hits.append(
            f"src/{repo.package}/{module}.py:{line}:     {rng.choice(VERBS)}_{word}("
            f"{module}s, limit={rng.randint(1, 64)})"
        )
    return "\n".join(hits)


def test_run(rng: random.Random, repo: Repo, failing: Sequence[str]) -> str:
    """``run_tests`` output in pytest's shape, with ``failing`` test names failing."""
    counts = {t: rng.randint(4, 12) for t in repo.tests}
    total = sum(counts.values())
    lines = [f"collected {total} items", ""]
    for t, n in counts.items():
        fails = any(f.startswith(f"tests/{t}.py::") for f in failing)
        marks = "".join("F" if fails and i == 1 else "." for i in range(n))
        lines.append(f"tests/{t}.py {marks}")
    if failing:
        lines += ["", "FAILURES"]
        for name in failing:
            template, exc = rng.choice(TEST_FAILURES)
            err = rng.choice(EXCEPTIONS)
            msg = template.format(
                x=rng.randint(0, 9),
                y=rng.randint(10, 99),
                n=rng.choice(NOUNS),
                a=rng.choice(ADJECTIVES),
                exc=err,
            )
            lines += [
                f"___ {name} ___",
                f"E   {msg}",
                f"{name.split('::')[0]}:{rng.randint(8, 90)}: {exc.format(exc=err)}",
            ]
    passed = total - len(failing)
    summary = f"{len(failing)} failed, {passed} passed" if failing else f"{passed} passed"
    lines.append(f"{summary} in {rng.randint(20, 300) / 100:.2f}s")
    return "\n".join(lines)
