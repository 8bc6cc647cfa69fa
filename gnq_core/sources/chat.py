"""Conversations as the trainer saw them: chat datasets read, rendered and masked as TRL's
``SFTTrainer`` does.

Formats (``--data-format``; ``auto`` looks at the columns of the first record):

* ``messages``: a ``messages`` column of ``{"role", "content"}`` lists (TRL's conversational
  language modelling);
* ``sharegpt``: a ``conversations`` column of ``{"from", "value"}`` lists; as TRL does
  (``maybe_convert_to_chatml``) only the keys are renamed, the role names are kept as written;
* ``prompt-completion``: ``prompt`` and ``completion`` columns, both strings or both message lists;
* ``alpaca``: ``instruction`` / ``input`` / ``output`` (and an optional ``system``) columns, read
  as a conversational prompt-completion: the user turn is the instruction, then a blank line and the
  input when there is one, the assistant turn the output (TRL has no Alpaca reader; this is the
  conversational form Axolotl and torchtune give it with a chat template);
* ``text``: one string per row (``sources.datasets.load_texts``, unchanged).

Each example is rendered exactly as TRL 1.x tokenises it: ``tokenizer.apply_chat_template(...,
tokenize=True)`` of the conversation (the ids are the template's string tokenised without special
tokens, so the rendered string stored as the example's text gives the same ids through
``tokens.encode_texts``); prompt-completion renders the prompt alone with the generation prompt
and the whole conversation, the completion starting where their ids diverge (TRL's
``common_prefix_length``); string prompt-completion is ``prompt + completion`` (+ EOS) tokenised
with the tokenizer's special tokens, as TRL does.

Which tokens were trained (``--train-on``; default what TRL does for the format):
``all`` (TRL's default for ``messages``/ShareGPT: every token), ``completion`` (its default for
prompt-completion and hence Alpaca: ``completion_only_loss``), ``assistant``
(``assistant_only_loss=True``: the template's ``{% generation %}`` spans, or the training template
TRL swaps in for the templates it knows; a template with neither is refused, as TRL refuses it).
The trained tokens are kept as runs of token positions (``ChatLayout.trained``); every loss, GNQ
and membership signal of the text is over them (labels −100 elsewhere, ``tokens.collate``).

Each example also keeps its turns: role, the character span of the message's content in the
rendered text, and whether any of its tokens was trained.  What lies outside every content span
was written by the template (role headers, end-of-turn markers, a default system prompt, a date
line): ``ChatLayout.template``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnq_core.sources.datasets import (
    DatasetError,
    TextDataset,
    file_sha256,
    public_cell_flag,
    secret_cell_values,
)

__all__ = ["CHAT_FORMATS", "DATA_FORMATS", "RECORD_FIELDS", "TRAIN_ON", "ChatDataset", "ChatLayout", "Turn",
           "TurnField", "chat_settings", "detect_format", "example_of", "load_chat", "load_data",
           "read_records", "render_example", "trained_default", "training_template", "turn_fields"]

DATA_FORMATS = ("auto", "text", "messages", "sharegpt", "prompt-completion", "alpaca")
TRAIN_ON = ("all", "assistant", "completion")
CHAT_FORMATS = DATA_FORMATS[2:]
# A role as the turn names it (ShareGPT and others write their own role names)
_ROLE_NAMES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
               "bot": "assistant", "model": "assistant", "chatgpt": "assistant",
               "system": "system", "tool": "tool"}
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class Turn:
    """One message of a rendered conversation: its role as written, its content's characters in the
    rendered text (``start == end == -1``: the template rewrote it and it was not found verbatim)
    and whether any of its tokens was trained."""

    role: str
    start: int
    end: int
    trained: bool

    @property
    def kind(self) -> str:
        """system / user / assistant (or the role as written when it is none of them)."""
        return _ROLE_NAMES.get(self.role.lower(), self.role)


@dataclass(frozen=True)
class ChatLayout:
    """Where a rendered conversation's turns are and which tokens were trained."""

    turns: tuple[Turn, ...]
    trained: tuple[tuple[int, int], ...]  # runs [i, j) of token positions that carry the loss
    n_tokens: int  # the rendered conversation's tokens (before --max-length truncation)
    template: tuple[tuple[int, int], ...] = field(default=())  # characters the template wrote

    def to_json(self) -> str:
        return json.dumps({"turns": [[t.role, t.start, t.end, t.trained] for t in self.turns],
                           "trained": [list(r) for r in self.trained], "n_tokens": self.n_tokens,
                           "template": [list(s) for s in self.template]}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> ChatLayout:
        data = json.loads(text)
        return cls(tuple(Turn(str(r), int(s), int(e), bool(tr)) for r, s, e, tr in data["turns"]),
                   tuple((int(i), int(j)) for i, j in data["trained"]), int(data["n_tokens"]),
                   tuple((int(i), int(j)) for i, j in data.get("template", [])))

    def conversation(self, text: str) -> str:
        """The rendered ``text`` read as ``role: content`` lines, one per turn."""
        return "\n".join(f"{t.kind}: {text[t.start:t.end]}" for t in self.turns if t.start >= 0)

    def trained_mask(self, length: int) -> list[bool]:
        """Per token position of the first ``length`` tokens: does it carry the loss."""
        mask = [False] * length
        for i, j in self.trained:
            for k in range(i, min(j, length)):
                mask[k] = True
        return mask


@dataclass(frozen=True)
class ChatDataset(TextDataset):
    """A chat dataset: ``texts`` are the rendered conversations (as tokenised at training), with
    each one's layout; ``data_format`` / ``train_on`` as read, ``found`` the one line that says so."""

    layouts: list[ChatLayout] = field(default_factory=list)
    data_format: str = "messages"
    train_on: str = "all"
    found: str = ""
    contents: list[str] = field(default_factory=list)  # each text's message contents, for copy detection


# ----------------------------------------------------------------------------------------------------------
# Reading records.


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a .jsonl or .parquet file or a ``datasets.save_to_disk`` folder, as dicts."""
    shown, p = str(path), Path(path)
    if not p.exists():
        raise DatasetError(shown, "no such file")
    if p.is_dir():
        return _read_saved(shown, p)
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        try:
            lines = p.read_text(encoding="utf-8-sig").split("\n")
        except UnicodeDecodeError as e:
            raise DatasetError(shown, f"not valid UTF-8: byte offset {e.start}") from e
        except OSError as e:
            raise DatasetError(shown, f"cannot read file ({e.strerror or e})") from e
        records = []
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError, ValueError) as e:
                raise DatasetError(shown, f"line {lineno}: invalid JSON ({e})") from e
            if not isinstance(obj, dict):
                raise DatasetError(shown, f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
            records.append(obj)
        return records
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(p).to_pylist()
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DatasetError(shown, f"not a readable parquet file ({e})") from e
    raise DatasetError(shown, f"chat data is read from .jsonl, .parquet or a datasets.save_to_disk folder, "
                              f"not {p.suffix or 'a file without extension'}")


def _read_saved(shown: str, p: Path) -> list[dict[str, Any]]:
    if not (p / "dataset_info.json").is_file() and not (p / "dataset_dict.json").is_file():
        raise DatasetError(shown, "is a directory, not a dataset file (nor a datasets.save_to_disk folder)")
    try:
        import datasets
    except ImportError as e:
        raise DatasetError(shown, "a datasets.save_to_disk folder needs the datasets library "
                                  "(pip install datasets)") from e
    try:
        data = datasets.load_from_disk(str(p))
    except (OSError, ValueError, FileNotFoundError) as e:
        raise DatasetError(shown, f"not a readable datasets.save_to_disk folder ({e})") from e
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise DatasetError(shown, f"a DatasetDict without a 'train' split (splits: {', '.join(data)})")
        data = data["train"]
    return data.to_list()


def columns_of(records: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(k for r in records[:100] for k in r))


def detect_format(columns: Sequence[str]) -> str:
    """The format a record's columns say, in TRL's order of precedence; "text" when none."""
    cols = set(columns)
    if "messages" in cols:
        return "messages"
    if "conversations" in cols:
        return "sharegpt"
    if {"prompt", "completion"} <= cols:
        return "prompt-completion"
    if {"instruction", "output"} <= cols:
        return "alpaca"
    return "text"


_NEEDS = {"messages": ("messages",), "sharegpt": ("conversations",),
          "prompt-completion": ("prompt", "completion"), "alpaca": ("instruction", "output")}


def trained_default(data_format: str) -> str:
    """What TRL trains on by default: every token of a conversation, the completion of a prompt."""
    return "completion" if data_format in ("prompt-completion", "alpaca") else "all"


# ----------------------------------------------------------------------------------------------------------
# One example, as TRL tokenises it.


@dataclass(frozen=True)
class Example:
    """A record in TRL's terms: ``messages`` (language modelling) or ``prompt`` + ``completion``."""

    messages: list[dict[str, Any]] | None = None
    prompt: list[dict[str, Any]] | str | None = None
    completion: list[dict[str, Any]] | str | None = None


def example_of(record: dict[str, Any], data_format: str, shown: str, row: int) -> Example:
    def messages(value: Any, what: str, keys: tuple[str, str] = ("role", "content")) -> list[dict[str, Any]]:
        if not isinstance(value, list) or not value:
            raise DatasetError(shown, f"row {row + 1}: {what!r} is not a non-empty list of messages")
        out = []
        for m in value:
            if not isinstance(m, dict) or keys[0] not in m or keys[1] not in m:
                raise DatasetError(shown, f"row {row + 1}: a message of {what!r} lacks "
                                          f"{keys[0]!r}/{keys[1]!r} (got "
                                          f"{sorted(m) if isinstance(m, dict) else type(m).__name__})")
            content = m[keys[1]]
            if not isinstance(content, str):
                raise DatasetError(shown, f"row {row + 1}: a message's {keys[1]!r} is a "
                                          f"{type(content).__name__}; multimodal content is not supported")
            out.append({**{k: v for k, v in m.items() if k not in keys and v is not None},
                        "role": str(m[keys[0]]), "content": content})
        return out

    if data_format == "messages":
        return Example(messages=messages(record.get("messages"), "messages"))
    if data_format == "sharegpt":
        return Example(messages=messages(record.get("conversations"), "conversations", ("from", "value")))
    if data_format == "prompt-completion":
        prompt, completion = record.get("prompt"), record.get("completion")
        if isinstance(prompt, str) and isinstance(completion, str):
            return Example(prompt=prompt, completion=completion)
        return Example(prompt=messages(prompt, "prompt"), completion=messages(completion, "completion"))
    if data_format == "alpaca":
        instruction, given, output = (record.get(k) for k in ("instruction", "input", "output"))
        if not isinstance(instruction, str) or not isinstance(output, str):
            raise DatasetError(shown, f"row {row + 1}: 'instruction' and 'output' must be strings")
        user = instruction + (f"\n\n{given}" if isinstance(given, str) and given.strip() else "")
        system = record.get("system")
        given_system = isinstance(system, str) and system.strip()
        prompt = [{"role": "system", "content": system}] if given_system else []
        return Example(prompt=[*prompt, {"role": "user", "content": user}],
                       completion=[{"role": "assistant", "content": output}])
    raise ValueError(f"not a chat format: {data_format!r}")


# The record's fields a rendered conversation is made of, per format (``turn_fields``)
RECORD_FIELDS = {"messages": ("messages",), "sharegpt": ("conversations",),
                 "prompt-completion": ("prompt", "completion"),
                 "alpaca": ("instruction", "input", "output", "system")}


@dataclass(frozen=True)
class TurnField:
    """Where a piece of one turn's content comes from in its record: the string at ``path``
    (``("messages", 2, "content")``, ``("output",)``), from character ``offset`` of the content."""

    path: tuple[str | int, ...]
    value: str
    offset: int


def turn_fields(record: dict[str, Any], data_format: str) -> list[tuple[str, list[TurnField]]]:
    """Per message of the conversation ``example_of`` makes of ``record``, in order: its content
    and the record's fields it is made of (one, except Alpaca's user turn: the instruction, then
    the input after a blank line) — what maps a span of the rendered text back to the file."""
    def listed(key: str, content_key: str = "content") -> list[tuple[str, list[TurnField]]]:
        return [(str(m[content_key]), [TurnField((key, k, content_key), str(m[content_key]), 0)])
                for k, m in enumerate(record.get(key) or [])]

    if data_format == "messages":
        return listed("messages")
    if data_format == "sharegpt":
        return listed("conversations", "value")
    if data_format == "prompt-completion":
        prompt, completion = record.get("prompt"), record.get("completion")
        if isinstance(prompt, str) and isinstance(completion, str):
            return [(prompt, [TurnField(("prompt",), prompt, 0)]),
                    (completion, [TurnField(("completion",), completion, 0)])]
        return listed("prompt") + listed("completion")
    if data_format == "alpaca":
        instruction, given, output, system = (record.get(k) for k in RECORD_FIELDS["alpaca"])
        out = []
        if isinstance(system, str) and system.strip():
            out.append((system, [TurnField(("system",), system, 0)]))
        user = [TurnField(("instruction",), instruction, 0)]
        if isinstance(given, str) and given.strip():
            user.append(TurnField(("input",), given, len(instruction) + 2))
        out.append((instruction + (f"\n\n{given}" if len(user) > 1 else ""), user))
        return [*out, (output, [TurnField(("output",), output, 0)])]
    raise ValueError(f"not a chat format: {data_format!r}")


@dataclass(frozen=True)
class Rendered:
    text: str  # whose tokens without special tokens are ``ids``
    ids: list[int]
    layout: ChatLayout
    contents: str  # the message contents alone, joined by newlines


def render_example(tokenizer, example: Example, train_on: str, *, chat_template: str | None = None,
                   where: str = "the data") -> Rendered:
    """``example`` rendered and tokenised as TRL's SFTTrainer does, with its trained tokens."""
    assistant = train_on == "assistant"
    kwargs: dict[str, Any] = {"chat_template": chat_template} if chat_template is not None else {}
    if example.messages is not None or not isinstance(example.prompt, str):
        whole = example.messages if example.messages is not None else [*example.prompt, *example.completion]
        out = tokenizer.apply_chat_template(whole, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=assistant, **kwargs)
        ids = list(out["input_ids"])
        text = tokenizer.apply_chat_template(whole, tokenize=False, **kwargs)
        mask = [True] * len(ids)
        if assistant:
            mask = [bool(b) for b in out["assistant_masks"]]
            if not any(mask):
                raise DatasetError(where, "--train-on assistant: an example has no assistant tokens "
                                          "(the chat template marks none with {% generation %}); TRL "
                                          "refuses it too")
        if example.messages is None:
            prompt_ids = tokenizer.apply_chat_template(example.prompt, tokenize=True, return_dict=True,
                                                       add_generation_prompt=True, **kwargs)["input_ids"]
            start = _common_prefix(prompt_ids, ids)
            if train_on in ("completion", "assistant"):  # TRL's default completion_only_loss applies to both
                mask = [m and k >= start for k, m in enumerate(mask)]
        messages = whole
    else:
        eos = tokenizer.eos_token or ""
        completion = example.completion if example.completion.endswith(eos) else example.completion + eos
        ids = list(tokenizer(text=example.prompt + completion)["input_ids"])
        start = _common_prefix(list(tokenizer(text=example.prompt)["input_ids"]), ids)
        text = _literal(tokenizer, example.prompt + completion, ids, where)
        mask = [train_on == "all" or k >= start for k in range(len(ids))]
        messages = [{"role": "prompt", "content": example.prompt},
                    {"role": "completion", "content": example.completion}]
    plain = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if plain != ids:  # the stored text must give the trained ids again
        raise DatasetError(where, "the rendered conversation does not tokenise back to the trainer's tokens; "
                                  "this tokenizer's chat template cannot be audited from its text")
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    turns = _turns(text, messages, mask, offsets)
    runs = _runs(mask)
    spans = sorted((t.start, t.end) for t in turns if t.start >= 0)
    template, at = [], 0
    for s, e in spans:
        if s > at:
            template.append((at, s))
        at = max(at, e)
    if at < len(text):
        template.append((at, len(text)))
    contents = "\n".join(m["content"] for m in messages)
    return Rendered(text, ids, ChatLayout(tuple(turns), tuple(runs), len(ids), tuple(template)), contents)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """TRL's ``common_prefix_length``: where the prompt's and the whole conversation's ids diverge."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _literal(tokenizer, text: str, ids: list[int], where: str) -> str:
    """The string whose tokens without special tokens are ``ids``: ``text`` with the BOS / EOS the
    tokenizer adds written out."""
    bos, eos = tokenizer.bos_token or "", tokenizer.eos_token or ""
    for candidate in (text, bos + text, text + eos, bos + text + eos):
        if list(tokenizer(candidate, add_special_tokens=False)["input_ids"]) == ids:
            return candidate
    raise DatasetError(where, "the tokenizer adds special tokens other than BOS/EOS around a text; "
                              "prompt-completion strings cannot be audited with it")


def _turns(text: str, messages: Sequence[dict[str, Any]], mask: Sequence[bool],
           offsets: Sequence[tuple[int, int]]) -> list[Turn]:
    """Each message's content found in the rendered text, in order (a template that trims it:
    the trimmed content), and whether a trained token overlaps it."""
    turns, at = [], 0
    for m in messages:
        content = m["content"]
        start = -1
        for needle in (content, content.strip()):
            if needle and (found := text.find(needle, at)) >= 0:
                start, end = found, found + len(needle)
                break
        if start < 0:
            turns.append(Turn(m["role"], -1, -1, False))
            continue
        at = end
        trained = any(mk and a < end and b > start for mk, (a, b) in zip(mask, offsets, strict=False))
        turns.append(Turn(m["role"], start, end, trained))
    return turns


def _runs(mask: Sequence[bool]) -> list[tuple[int, int]]:
    runs, start = [], None
    for k, m in enumerate([*mask, False]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            runs.append((start, k))
            start = None
    return runs


def training_template(tokenizer, train_on: str, where: str) -> str | None:
    """The chat template TRL renders with: its training template (with ``{% generation %}``) when
    assistant-only loss needs one the tokenizer's lacks; None: the tokenizer's own."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise DatasetError(where, "chat data needs a chat template, and this tokenizer has none (give a "
                                  "checkpoint whose tokenizer_config.json has one, or --tokenizer)")
    if train_on != "assistant" or (isinstance(template, str) and _GENERATION.search(template)):
        return None
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError as e:
        raise DatasetError(where, "--train-on assistant: the chat template has no {% generation %} markers "
                                  "and trl (which knows the training templates) is not installed") from e
    try:
        return get_training_chat_template(tokenizer)
    except ValueError as e:
        raise DatasetError(where, "--train-on assistant: the chat template has no {% generation %} "
                                  "markers and TRL has no training template for it (TRL refuses "
                                  "assistant_only_loss on it too)"
                           ) from e


# ----------------------------------------------------------------------------------------------------------
# A whole dataset.


def chat_settings(dataset: TextDataset) -> dict[str, Any]:
    """What a run records of how its chat data were read (nothing for plain texts, so runs of plain
    texts made before chat data still match on resume)."""
    if not isinstance(dataset, ChatDataset):
        return {}
    return {"data_format": dataset.data_format, "train_on": dataset.train_on,
            "trained_tokens": f"{dataset.train_on} tokens of each conversation rendered with the chat "
                              "template, as TRL's SFTTrainer trains them (losses, GNQ and membership "
                              "signals over those tokens)"}


def load_chat(path: str | Path, tokenizer, *, data_format: str = "auto", train_on: str | None = None,
              secret_column: str | None = None, public_column: str | None = None) -> ChatDataset | None:
    """The conversations of ``path`` rendered with ``tokenizer``'s chat template; None when the data
    are plain texts (``data_format`` "text", or "auto" finding no chat columns)."""
    shown = str(path)
    if data_format not in DATA_FORMATS:
        raise DatasetError(shown, f"--data-format must be one of {', '.join(DATA_FORMATS)}, "
                                  f"not {data_format!r}")
    if train_on is not None and train_on not in TRAIN_ON:
        raise DatasetError(shown, f"--train-on must be one of {', '.join(TRAIN_ON)}, not {train_on!r}")
    if data_format == "text":
        return None
    p = Path(path)
    if p.is_file() and p.suffix.lower() not in (".jsonl", ".parquet"):
        if data_format == "auto":
            return None
        raise DatasetError(shown, f"--data-format {data_format} reads .jsonl, .parquet or a "
                                  "datasets.save_to_disk folder")
    records = read_records(p)
    if not records:
        raise DatasetError(shown, "no examples")
    columns = columns_of(records)
    fmt = detect_format(columns) if data_format == "auto" else data_format
    if fmt == "text":
        return None
    missing = [c for c in _NEEDS[fmt] if c not in columns]
    if missing:
        raise DatasetError(shown, f"--data-format {fmt} needs column(s) {', '.join(missing)} "
                                  f"(columns: {', '.join(columns)})")
    train_on = train_on or trained_default(fmt)
    if train_on == "completion" and fmt in ("messages", "sharegpt"):
        raise DatasetError(shown, f"--train-on completion needs a prompt and a completion; {fmt} data have "
                                  "neither: use --train-on all or assistant")
    template = training_template(tokenizer, train_on, shown)
    texts, layouts, contents = [], [], []
    secrets: list[list[str]] = []
    public: list[bool] = []
    for i, record in enumerate(records):
        rendered = render_example(tokenizer, example_of(record, fmt, shown, i), train_on,
                                  chat_template=template, where=shown)
        texts.append(rendered.text)
        layouts.append(rendered.layout)
        contents.append(rendered.contents)
        if secret_column is not None:
            secrets.append(secret_cell_values(record.get(secret_column)))
        if public_column is not None:
            public.append(public_cell_flag(shown, record.get(public_column), public_column, i))
    for what, col in (("--secret-column", secret_column), ("--public-column", public_column)):
        if col is not None and col not in columns:
            raise DatasetError(shown, f"no column {col!r} for {what} (columns: {', '.join(columns)})")
    n_trained = sum(j - i for lay in layouts for i, j in lay.trained)
    n_all = sum(lay.n_tokens for lay in layouts)
    found = (f"{shown}: read as {fmt} ({len(texts)} conversations, columns {', '.join(_NEEDS[fmt])}); "
             f"rendered with the chat template; trained on {train_on} tokens "
             f"({n_trained:,} of {n_all:,}, before --max-length)")
    sha = file_sha256(p) if p.is_file() else _folder_sha(p)
    return ChatDataset(path=p.resolve(), texts=texts, groups=[None] * len(texts), sha256=sha,
                       text_column=None, group_column=None,
                       secret_values=secrets if secret_column is not None else None,
                       public=public if public_column is not None else None,
                       secret_column=secret_column, public_column=public_column,
                       layouts=layouts, data_format=fmt, train_on=train_on, found=found, contents=contents)


def _folder_sha(p: Path) -> str:
    """A save_to_disk folder's identity: the SHA-256 of its files' names and digests."""
    import hashlib

    digest = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        digest.update(f"{f.relative_to(p)}\0{file_sha256(f)}\n".encode())
    return digest.hexdigest()


def load_data(path: str | Path, tokenizer: Callable[[], Any] | None = None, *, data_format: str = "auto",
              train_on: str | None = None, text_column: str | None = None, group_column: str | None = None,
              secret_column: str | None = None, public_column: str | None = None) -> TextDataset:
    """The one way a job reads its data: chat records rendered with the tokenizer ``tokenizer()``
    loads (called only for chat data: the checkpoint's, or its base model's for adapters), else the
    plain texts of ``load_texts``.  A --text-column names plain texts, so auto looks no further."""
    from gnq_core.sources.datasets import load_texts

    if _looks_like_chat(Path(path), data_format, text_column):
        if tokenizer is None:
            raise DatasetError(str(path), "chat data are rendered with the model's chat template: "
                                          "this command has no tokenizer to render them with")
        found = load_chat(path, tokenizer(), data_format=data_format, train_on=train_on,
                          secret_column=secret_column, public_column=public_column)
        if found is not None:
            if group_column is not None:
                raise DatasetError(str(path), "--group-column applies to plain texts, not chat data")
            return found
    if train_on is not None:
        raise DatasetError(str(path), "--train-on applies to chat data; these are plain texts (every token "
                                      "trained)")
    return load_texts(path, text_column=text_column, group_column=group_column, secret_column=secret_column,
                      public_column=public_column)


def _looks_like_chat(p: Path, data_format: str, text_column: str | None) -> bool:
    """Whether to read ``p`` as chat records: a chat format named, or auto on a .jsonl / .parquet
    file (or a saved folder) whose first record has chat columns."""
    if data_format == "text" or (data_format == "auto" and text_column is not None):
        return False
    if data_format != "auto" or p.is_dir():
        return True
    if p.suffix.lower() not in (".jsonl", ".parquet") or not p.is_file():
        return False
    return detect_format(columns_of(_first_records(p))) != "text"


def _first_records(p: Path) -> list[dict[str, Any]]:
    """The first record of a .jsonl or .parquet file (for auto's look at the columns)."""
    if p.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            return [dict.fromkeys(pq.ParquetFile(p).schema_arrow.names)]
        except Exception:  # noqa: BLE001  (load_texts gives the one-line error)
            return [{"text": None}]
    try:
        with open(p, encoding="utf-8-sig") as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    return [obj] if isinstance(obj, dict) else [{"text": None}]
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return [{"text": None}]  # unreadable: load_texts says why in one line
