"""The regular expressions of an adapter's config, tried in a worker process with a time limit
before PEFT runs them.

PEFT reads several fields of ``adapter_config.json`` as Python regexes and matches them against
every module name of the model: a string ``target_modules`` (``re.fullmatch``), ``exclude_modules``
and IA3's ``feedforward_modules`` likewise, each ``modules_to_save`` and ``layers_pattern`` entry
inside a larger pattern, and the keys of ``rank_pattern`` / ``alpha_pattern``.  The config is
untrusted: an invalid pattern ends in PEFT's traceback, and one that backtracks (``(.*)*x``) runs
for hours in ``re``, which holds the GIL, so a dashboard checking the adapter in its own process
stops answering every session.

Here each pattern is compiled and matched, the ways PEFT uses it, against the base model's module
names in a separate Python (standard library only; it starts in ~30 ms) that is killed after
``GNQ_REGEX_SECONDS`` (default 1).  Waiting on it releases the GIL.  A pattern that passes took
less than that on these names, so PEFT's own matching of it is bounded the same way; one that
does not is refused in one line naming the field, as is an invalid one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gnq_core.sources.checkpoints.errors import folder_error, reason
from gnq_core.sources.limits import env_int

__all__ = ["check_adapter_patterns", "regex_seconds"]

DEFAULT_REGEX_SECONDS = 1

# How PEFT uses each field (peft/tuners/tuners_utils.py, peft/utils/other.py, the tuners' models):
# "{}" stands for the pattern; "fullmatch"/"match"/"search" is the re function.
_WHOLE = (("fullmatch", "{}"),)
_SAVED = (("match", r"(^|.*\.){}($|\..*)"),)
_LAYERS = (("match", r"(?:^|.*?\.){}\.(?P<idx>\d+)\."),)
_KEYS = (("match", r"(.*\.)?({})$"), ("match", r".*\.{}$"), ("search", "{}"))
_STRING_FIELDS = {"target_modules": _WHOLE, "exclude_modules": _WHOLE, "feedforward_modules": _WHOLE,
                  "layers_pattern": _LAYERS}
_LIST_FIELDS = {"modules_to_save": _SAVED, "layers_pattern": _LAYERS}
_KEY_FIELDS = {"rank_pattern": _KEYS, "alpha_pattern": _KEYS}

# The worker: reads {"names": [...], "patterns": [[field, pattern, [[function, form], ...]], ...]} as
# UTF-8 JSON on stdin, prints the first problem as JSON (null when none).
_WORKER = r"""
import json, re, sys
job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
problem = None
for field, pattern, forms in job["patterns"]:
    try:
        re.compile(pattern)
        compiled = [(getattr(re.compile(form.replace("{}", pattern)), function)) for function, form in forms]
    except (re.error, RecursionError, OverflowError, MemoryError) as exc:
        problem = [field, pattern, str(exc)]
        break
    for name in job["names"]:
        for match in compiled:
            match(name)
sys.stdout.write(json.dumps(problem))
"""


def regex_seconds() -> int:
    """How long all of one adapter's patterns may take on the base's module names:
    ``$GNQ_REGEX_SECONDS``, else 1."""
    return env_int("GNQ_REGEX_SECONDS", DEFAULT_REGEX_SECONDS, unit="a number of seconds")


def _patterns(raw: dict[str, Any]) -> Iterator[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """(field, pattern, the ways PEFT matches it) for every regex in the config."""
    for field, forms in _STRING_FIELDS.items():
        if isinstance(raw.get(field), str):
            yield field, raw[field], forms
    for field, forms in _LIST_FIELDS.items():
        if isinstance(raw.get(field), list):
            yield from ((field, p, forms) for p in raw[field] if isinstance(p, str))
    for field, forms in _KEY_FIELDS.items():
        if isinstance(raw.get(field), dict):
            yield from ((f"{field} key", p, forms) for p in raw[field] if isinstance(p, str))


def _shown(pattern: str) -> str:
    return repr(pattern) if len(pattern) <= 60 else repr(pattern[:57]) + "…"


def check_adapter_patterns(config_path: Path, raw: dict[str, Any], names: Sequence[str]) -> None:
    """Refuse (CheckpointError, one line naming ``config_path`` and the field) a regex of the
    adapter config ``raw`` that is invalid, or that takes more than ``regex_seconds()`` to match
    the module ``names`` the ways PEFT does."""
    patterns = [[field, pattern, list(map(list, forms))] for field, pattern, forms in _patterns(raw)]
    if not patterns:
        return
    limit = regex_seconds()
    job = json.dumps({"names": list(names), "patterns": patterns}).encode("utf-8")
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _WORKER], input=job, capture_output=True,
                              timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        fields = ", ".join(dict.fromkeys(p[0] for p in patterns))
        raise folder_error(config_path, f"{fields}: matching the regular expression(s) against the base "
                                        f"model's {len(names)} module names takes more than {limit} s "
                                        "(a pattern that backtracks); list the module names instead "
                                        "(GNQ_REGEX_SECONDS sets the limit)") from None
    except OSError as exc:
        raise folder_error(config_path, f"cannot check its regular expressions ({reason(exc)})") from exc
    try:
        problem = json.loads(done.stdout.decode("utf-8")) if done.returncode == 0 else ["", "", ""]
    except (UnicodeDecodeError, json.JSONDecodeError):
        problem = ["", "", ""]
    if problem == ["", "", ""]:
        raise folder_error(config_path, "cannot check its regular expressions (the checking process ended "
                                        f"with exit code {done.returncode})")
    if problem is not None:
        field, pattern, why = problem
        raise folder_error(config_path, f"{field}: {_shown(pattern)} is not a valid regular expression "
                                        f"({why})")
