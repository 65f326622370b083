"""Fenced code blocks of a Markdown page and the shell commands in them, for the tests that run the docs' Python
blocks (test_docs_api, test_docs_pages, test_docs_algorithms, test_docs_own_data) and check their shell commands
(test_docs_commands)."""

from __future__ import annotations

import re
import shlex

SHELLS = ("bash", "sh", "shell", "console")
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")  # VAR=value before a command


def blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block."""
    found, info, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and info is None:
            info, body = fence.group(1), []
        elif fence:
            found.append((info, "\n".join(body)))
            info = None
        elif info is not None:
            body.append(line)
    return found


def commands(text: str) -> list[str]:
    """The command lines of a page's shell blocks (and the `dpfl` lines of blocks without a language):
    continuations joined, comments and prompts dropped."""
    out: list[str] = []
    for info, block in blocks(text):
        if info not in SHELLS and info != "":
            continue
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            if not line or line.startswith("#") or (info == "" and dpfl_args(words(line)) is None):
                continue
            out.append(line)
    return out


def words(line: str) -> list[str]:
    """The words of one command, without a trailing comment, `VAR=x` prefixes and the `[ ]` of optional parts."""
    try:
        parts = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote inside a heredoc line, say: not a command we check
        return []
    while parts and ENV.match(parts[0]):
        parts = parts[1:]
    return [w for w in (_unbracket(p) for p in parts) if w]


def _unbracket(word: str) -> str:
    """`[--json]` -> `--json` (an optional part); `.[ray,flower]` stays as it is."""
    word = word[1:] if word.startswith("[") else word
    return word[:-1] if word.endswith("]") and "[" not in word else word


def dpfl_args(parts: list[str]) -> list[str] | None:
    """The arguments after `dpfl` (also `.venv/bin/dpfl`, `python -m dpfl.cli`), or None for another program."""
    if parts and (parts[0] == "dpfl" or parts[0].endswith("/bin/dpfl")):
        return parts[1:]
    if len(parts) > 2 and parts[1:3] == ["-m", "dpfl.cli"]:
        return parts[3:]
    return None




def fenced(text: str, language: str) -> list[str]:
    """The bodies of the page's ```language blocks, in order."""
    return [body for info, body in blocks(text) if info == language]


def segments(parts: list[str]) -> list[list[str]]:
    """The commands of one line joined by && or ;."""
    out: list[list[str]] = [[]]
    for p in parts:
        if p in ("&&", ";", "||"):
            out.append([])
        else:
            out[-1].append(p)
    return [o for o in out if o]
