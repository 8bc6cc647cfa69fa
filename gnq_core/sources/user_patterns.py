"""The user's own regular expressions (``--secret-pattern``, the New audit form's "Secret
patterns", a job file's ``secret_patterns``), compiled and matched in a worker process with a
time limit before this process runs them.

A pattern with nested quantifiers (``(a+)+$``) backtracks for hours on a text it cannot match, in
Python's ``re``, which holds the interpreter lock: ``gnq audit`` stopped in labelling with no
progress, and the dashboard's "Measure" stopped every session, the websocket and the health probe.
A pattern past the engine's limits raised ``OverflowError`` (a repeat count) or ``RecursionError``
(deep nesting), not ``re.error``, and printed a traceback.

Here, as for an adapter's patterns (sources/adapter_patterns.py: the same worker design and the
same ``GNQ_REGEX_SECONDS``, default 1), each pattern is compiled, then matched the way the secret
scan matches it (``finditer``, at most the scan's number of values a text) over the texts to be
searched, in a separate Python (standard library only) that reports before each step; a step
that takes longer than the limit (a compile, or one pattern over one chunk of texts, the limit
growing with the chunk's size past 64 KB) kills it, and the pattern is refused in one line naming
it.  Waiting on the worker releases the interpreter lock, so a dashboard session measuring with
such a pattern never stops another's.  A pattern that passed took less than the limit on these
very texts, so this process's own matching of them afterwards is bounded the same way.

Why not a linear-time engine (RE2; ``google-re2`` installs as a wheel on Linux x86-64): users'
value patterns use what RE2 lacks (look-behind such as ``(?<=PIN )\\d{4}``, back-references), and
RE2's ``\\d``, ``\\w`` and ``\\b`` are ASCII where Python's are Unicode, so the values found would
change with the engine; one engine, bounded, keeps every pattern's meaning.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from gnq_core.errors import GNQError
from gnq_core.sources.adapter_patterns import regex_seconds

__all__ = ["PatternError", "bounded_patterns", "compile_user_patterns", "shown"]

OPTION = "--secret-pattern"
CHUNK_CHARS = 64 * 1024  # texts searched under one limit; a longer text gets a limit per 64 KB
CHUNK_TEXTS = 256
START_SECONDS = 30  # the worker's own start on a busy machine, before its first step is timed
DEFAULT_MOST = 1024  # values found a text per pattern (sources.secrets.MAX_VALUES_PER_TEXT)


class PatternError(GNQError, ValueError):
    """A user's regular expression that does not compile or takes too long; one line naming it."""


# The worker: argv[1] is a UTF-8 JSON file {"patterns": [...], "texts": [...], "chunks": [[a, b], ...],
# "most": N}; it prints one JSON line before each step and {"bad": i, "why": ...} for a pattern that
# does not compile.
_WORKER = r"""
import json, re, sys
with open(sys.argv[1], encoding="utf-8") as f:
    job = json.load(f)
def say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
compiled = []
for i, pattern in enumerate(job["patterns"]):
    say({"compile": i})
    try:
        compiled.append(re.compile(pattern))
    except (re.error, OverflowError, RecursionError, MemoryError, ValueError, TypeError) as exc:
        say({"bad": i, "why": type(exc).__name__ + ": " + str(exc)})
        sys.exit(0)
texts, most = job["texts"], job["most"]
for c, (a, b) in enumerate(job["chunks"]):
    for i, pattern in enumerate(compiled):
        say({"match": [c, i]})
        for text in texts[a:b]:
            for n, _ in enumerate(pattern.finditer(text), 1):
                if n >= most:
                    break
say({"done": True})
"""


def shown(pattern: str) -> str:
    """A pattern as a message shows it: quoted, cut at 60 characters, on one line."""
    text = repr(pattern)
    return text if len(text) <= 62 else text[:59] + "…'"


def _compile_problem(why: str) -> str:
    """The engine's complaint in words: what it means for this pattern."""
    kind, _, detail = why.partition(": ")
    if kind == "RecursionError":
        return "it nests too deeply for Python's regular-expression engine"
    if kind == "OverflowError":
        return f"a repeat count or group is past the engine's limit ({detail})"
    if kind == "MemoryError":
        return "compiling it runs out of memory"
    return detail or kind


def _chunks(texts: Sequence[str]) -> list[tuple[int, int, float]]:
    """(first, end, scale) of consecutive texts searched under one limit, ``scale`` × the limit."""
    out, start, chars = [], 0, 0
    for i, text in enumerate(texts):
        if i > start and (chars + len(text) > CHUNK_CHARS or i - start >= CHUNK_TEXTS):
            out.append((start, i, max(1.0, chars / CHUNK_CHARS)))
            start, chars = i, 0
        chars += len(text)
    if start < len(texts):
        out.append((start, len(texts), max(1.0, chars / CHUNK_CHARS)))
    return out


def _run_worker(patterns: Sequence[str], texts: Sequence[str], most: int, option: str,
                where: str) -> None:
    limit = regex_seconds()
    chunks = _chunks(texts)
    with tempfile.TemporaryDirectory(prefix="gnq-patterns-") as folder:
        job_file = Path(folder) / "job.json"
        job_file.write_text(json.dumps({"patterns": list(patterns), "texts": list(texts), "most": most,
                                        "chunks": [[a, b] for a, b, _ in chunks]}), encoding="utf-8")
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-c", _WORKER, str(job_file)],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise PatternError(f"{option}: cannot check the regular expressions "
                               f"({exc.strerror or exc})") from exc
        lines: queue.Queue[bytes | None] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True, name="gnq-pattern-reader").start()
        step, wait = None, float(START_SECONDS)
        try:
            while True:
                try:
                    line = lines.get(timeout=wait)  # waits without holding the interpreter lock
                except queue.Empty:
                    raise _too_slow(patterns, step, limit, texts, chunks, option, where) from None
                if line is None:
                    break
                step = json.loads(line)
                if "bad" in step:
                    i = step["bad"]
                    raise PatternError(f"{option} {shown(patterns[i])} is not a valid regular expression: "
                                       f"{_compile_problem(step['why'])}")
                if "done" in step:
                    return
                wait = limit * (chunks[step["match"][0]][2] if "match" in step else 1.0)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    raise PatternError(f"{option}: cannot check the regular expressions (the checking process ended "
                       f"with exit code {proc.returncode})")


def _too_slow(patterns: Sequence[str], step: dict | None, limit: int, texts: Sequence[str],
              chunks: list[tuple[int, int, float]], option: str, where: str) -> PatternError:
    if step is None:
        return PatternError(f"{option}: the process that checks the regular expressions did not start within "
                            f"{START_SECONDS} s")
    if "compile" in step:
        return PatternError(f"{option} {shown(patterns[step['compile']])}: compiling it takes more than "
                            f"{limit} s; refused (GNQ_REGEX_SECONDS sets the limit)")
    c, i = step["match"]
    a, b, scale = chunks[c]
    seconds = f"{limit * scale:g}"
    place = f"text {a + 1}" if b == a + 1 else f"texts {a + 1}–{b}"
    return PatternError(f"{option} {shown(patterns[i])} takes more than {seconds} s to search {place}"
                        f"{' of ' + where if where else ''} (a pattern that backtracks, such as nested "
                        "quantifiers (a+)+); simplify it (GNQ_REGEX_SECONDS sets the limit)")


def compile_user_patterns(patterns: Sequence[str], option: str = OPTION) -> list[re.Pattern[str]]:
    """The user's patterns compiled, after a worker compiled each within the limit; a pattern that
    does not compile, for any reason of the engine's, or takes too long to, raises ``PatternError``
    (one line naming it and ``option``)."""
    patterns = list(patterns)
    for p in patterns:
        if not isinstance(p, str):
            raise PatternError(f"{option}: a regular expression is a text, not {type(p).__name__}")
    if not patterns:
        return []
    _run_worker(patterns, [], DEFAULT_MOST, option, "")
    return _compile_only(patterns, option)


def bounded_patterns(patterns: Sequence[str], texts: Sequence[str], public: Sequence[bool] | None = None,
                     *, most: int = DEFAULT_MOST, option: str = OPTION, where: str = ""
                     ) -> list[re.Pattern[str]]:
    """The user's patterns compiled, after a worker matched each over ``texts`` (those not
    ``public``: they are not searched) within the limit; ``PatternError`` (one line naming the
    pattern, the text and ``where``, the file) otherwise."""
    patterns = list(patterns)
    if not patterns:
        return []
    searched = [("" if public is not None and public[i] else str(t)) for i, t in enumerate(texts)]
    _run_worker(patterns, searched, most, option, where)
    return _compile_only(patterns, option)


def _compile_only(patterns: Sequence[str], option: str = OPTION) -> list[re.Pattern[str]]:
    """In-process compile of patterns a worker has just compiled and matched."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except (re.error, OverflowError, RecursionError, MemoryError, ValueError) as exc:
            why = _compile_problem(f"{type(exc).__name__}: {exc}")
            raise PatternError(f"{option} {shown(p)} is not a valid regular expression: {why}") from None
    return out


