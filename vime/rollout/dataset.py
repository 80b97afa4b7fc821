"""Prompt files (JSONL, Parquet) read into `Sample`s, as slime's `Dataset` reads them.

One record is one prompt: `--input-key` holds a string or a list of chat messages,
`--label-key` the label, `--metadata-key` a dict (or JSON text) copied into `sample.metadata`,
`--tool-key` the tools given to the chat template. Bad data fails at load time with a
`ConfigError` naming the file, the line (JSONL) or row (Parquet) and the key, because a bad
record found hours into a run costs the run.

A path may end in `@[start:end]` to take a slice of the records (slime's generalized path).

`check_prompt_file` runs the same per-record checks on the first rows only, so `vime train` can
refuse a bad file before it starts any service (see `vime.preflight`).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.log import get_logger
from vime.rollout import tokenization
from vime.types import Sample

log = get_logger(__name__)

_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


def split_slice(path: str) -> tuple[str, slice | None]:
    """`data.jsonl@[10:20]` -> ("data.jsonl", slice(10, 20)); a plain path has no slice."""
    m = _SLICE.match(str(path))
    if m is None:
        return str(path), None
    start, end = m.group("start"), m.group("end")
    return m.group("path"), slice(int(start) if start else None, int(end) if end else None)


def read_records(path: str, flag: str = "--prompt-data") -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield `(where, record)`: `where` is "file:line" (JSONL) or "file row N" (Parquet).

    Records are read as they are consumed, so taking the first few of a large file reads only
    the start of it; a slice with a negative bound (`@[-10:]`) reads the whole file first.
    """
    real, row_slice = split_slice(path)
    p = Path(real)
    if p.is_dir():
        raise ConfigError(f"{flag} {real!r}: is a directory; point it at a .jsonl or .parquet file")
    if not p.is_file():
        raise ConfigError(f"{flag} {real!r}: no such file")
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet"):
        raise ConfigError(f"{flag} {real!r}: unsupported file type {suffix!r}; use .jsonl or .parquet")
    start, stop = (row_slice.start or 0, row_slice.stop) if row_slice is not None else (0, None)
    if start < 0 or (stop is not None and stop < 0):  # counted from the end: needs every record
        rows = read_jsonl_objects(p, flag) if suffix != ".parquet" else _read_parquet(p, flag)
        yield from list(rows)[row_slice]
        return
    if suffix == ".parquet":
        rows = itertools.islice(_read_parquet(p, flag), start, stop)
    else:
        rows = read_jsonl_objects(p, flag, skip=start)
        rows = rows if stop is None else itertools.islice(rows, max(0, stop - start))
    yield from rows


def read_jsonl_objects(path: Path, flag: str, skip: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """`(where, record)` for each non-blank line of a JSONL file whose lines must be JSON objects;
    `where` is `path:line` for error messages, and a bad line is a `ConfigError` naming `flag`.
    The first `skip` records are passed over unparsed (a slice `@[start:]` of a large file)."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if skip > 0:
                skip -= 1
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{flag} {where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
            if not isinstance(record, dict):
                raise ConfigError(f"{flag} {where}: expected a JSON object per line, got {type(record).__name__}")
            yield where, record


def _read_parquet(path: Path, flag: str, batch_rows: int = 1024) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of a Parquet file, `batch_rows` at a time (row numbers count from 0)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError(f"{flag} {str(path)!r}: reading Parquet needs pyarrow (pip install pyarrow)") from exc
    def unreadable(exc: Exception) -> ConfigError:
        return ConfigError(f"{flag} {str(path)!r}: not a readable Parquet file ({exc})")

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=batch_rows)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise unreadable(exc) from exc
    i = 0
    while True:
        try:
            batch = next(batches, None)
        except Exception as exc:  # noqa: BLE001 - as above, for a file that breaks part way
            raise unreadable(exc) from exc
        if batch is None:
            return
        for record in batch.to_pylist():
            yield f"{path} row {i}", record
            i += 1


def no_records_error(path: str, flag: str = "--prompt-data") -> ConfigError:
    """The error for a prompt file that yields no record, saying why: an empty file, only blank
    lines, a Parquet file without rows, or a slice that selects nothing."""
    real, row_slice = split_slice(path)
    p = Path(real)
    if p.stat().st_size == 0:
        why = "the file is empty"
    elif row_slice is not None:
        bounds = ["" if b is None else str(b) for b in (row_slice.start, row_slice.stop)]
        why = f"the slice @[{bounds[0]}:{bounds[1]}] selects none of its records"
    elif p.suffix.lower() == ".parquet":
        why = "the Parquet file has no rows"
    else:
        why = "every line is blank"
    return ConfigError(f"{flag} {real!r}: the file has no records ({why}); it needs one prompt per line or row")


def check_prompt_file(
    path: str,
    *,
    flag: str = "--prompt-data",
    input_key: str = "input",
    label_key: str | None = None,
    metadata_key: str = "metadata",
    tool_key: str | None = "tools",
    limit: int = 100,
) -> int:
    """Check the first `limit` records of `path` as `PromptDataset` would read them; returns how
    many were checked.

    Raises the `ConfigError` the loader would raise for the first bad record (it names `flag`,
    the file, the line or Parquet row, and the key), or `no_records_error`. Reads only the start
    of the file and needs no tokenizer, so it is cheap on any file size.
    """
    checked = 0
    for where, record in itertools.islice(read_records(path, flag), limit):
        _record_to_sample(record, where, flag=flag, input_key=input_key, label_key=label_key,
                          metadata_key=metadata_key, tool_key=tool_key)
        checked += 1
    if checked == 0:
        raise no_records_error(path, flag)
    return checked


class PromptDataset:
    """The prompts of one file, in file order, after the `--rollout-max-prompt-len` filter.

    `samples[i]` is a template `Sample` (prompt, label, metadata); callers copy it before
    filling it in. `permutation(epoch)` is the seeded order of an epoch when shuffling.
    """

    def __init__(
        self,
        path: str,
        *,
        tokenizer: Any = None,
        input_key: str = "input",
        label_key: str | None = None,
        metadata_key: str = "metadata",
        tool_key: str | None = "tools",
        apply_chat_template: bool = False,
        apply_chat_template_kwargs: dict[str, Any] | None = None,
        max_prompt_len: int | None = None,
        seed: int = 42,
        flag: str = "--prompt-data",
    ) -> None:
        self.path = path
        self.seed = seed
        self._tokenizer = tokenizer
        self.samples: list[Sample] = []
        self.num_filtered = 0
        self._permutations: dict[int, list[int]] = {}
        needs_tokenizer = apply_chat_template or max_prompt_len is not None
        if needs_tokenizer and tokenizer is None:
            why = "--apply-chat-template" if apply_chat_template else "--rollout-max-prompt-len"
            raise ConfigError(f"{why} needs the tokenizer: set --hf-checkpoint")
        kwargs = dict(apply_chat_template_kwargs or {})
        seen = 0
        for where, record in read_records(path, flag):
            seen += 1
            sample, tools = _record_to_sample(
                record, where, flag=flag, input_key=input_key, label_key=label_key,
                metadata_key=metadata_key, tool_key=tool_key,
            )
            if apply_chat_template:
                messages = sample.prompt
                if isinstance(messages, str):
                    messages = [{"role": "user", "content": messages}]
                sample.prompt = tokenization.render_prompt(
                    tokenizer, messages, tools=tools, chat_template_kwargs=kwargs
                )
            if max_prompt_len is not None:
                text = tokenization.render_prompt(tokenizer, sample.prompt, tools=tools, chat_template_kwargs=kwargs)
                if len(tokenization.encode(tokenizer, text)) > max_prompt_len:
                    self.num_filtered += 1
                    continue
            self.samples.append(sample)
        if seen == 0:
            raise no_records_error(path, flag)
        if not self.samples:
            raise ConfigError(
                f"{flag} {path!r}: all {seen} prompts are longer than --rollout-max-prompt-len {max_prompt_len} "
                "tokens; raise the limit"
            )
        if self.num_filtered:
            log.warning("rollout.data.filtered", path=path, dropped=self.num_filtered, kept=len(self.samples),
                        max_prompt_len=max_prompt_len)

    @classmethod
    def from_args(cls, args: Any, path: str | None = None, *, flag: str = "--prompt-data") -> PromptDataset:
        """The dataset `args` describes (`path` overrides `--prompt-data`, for eval sets)."""
        path = path or args.prompt_data
        if not path:
            raise ConfigError(f"{flag} is not set; point it at a .jsonl or .parquet prompt file")
        needs_tokenizer = args.apply_chat_template or args.rollout_max_prompt_len is not None
        if needs_tokenizer and not getattr(args, "hf_checkpoint", None):
            why = "--apply-chat-template" if args.apply_chat_template else "--rollout-max-prompt-len"
            raise ConfigError(f"{why} needs the tokenizer: set --hf-checkpoint")
        return cls(
            path,
            tokenizer=tokenization.tokenizer_for(args) if needs_tokenizer else None,
            input_key=args.input_key,
            label_key=args.label_key,
            metadata_key=args.metadata_key,
            tool_key=args.tool_key,
            apply_chat_template=args.apply_chat_template,
            apply_chat_template_kwargs=args.apply_chat_template_kwargs,
            max_prompt_len=args.rollout_max_prompt_len,
            seed=args.rollout_seed,
            flag=flag,
        )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]

    def permutation(self, epoch: int) -> list[int]:
        """The order of epoch `epoch`: a permutation seeded by `seed + epoch`, the same in every process."""
        perm = self._permutations.get(epoch)
        if perm is None:
            perm = list(range(len(self.samples)))
            random.Random(self.seed + epoch).shuffle(perm)
            if len(self._permutations) >= 4:
                self._permutations.pop(next(iter(self._permutations)))
            self._permutations[epoch] = perm
        return perm


def _record_to_sample(
    record: dict[str, Any], where: str, *, flag: str, input_key: str, label_key: str | None,
    metadata_key: str, tool_key: str | None,
) -> tuple[Sample, list[dict[str, Any]] | None]:
    """The template sample of one record, and its tools (also kept as `metadata["tools"]`, unless the
    record's metadata already has that key, so a custom generate can hand them to its agent)."""
    if input_key not in record:
        raise ConfigError(
            f"{flag} {where}: no key {input_key!r} (the record has {sorted(record)}); "
            "set --input-key to the key that holds the prompt"
        )
    prompt = record[input_key]
    if not isinstance(prompt, str) and not tokenization.is_messages(prompt):
        raise ConfigError(
            f"{flag} {where}: {input_key!r} must be a string or a list of chat messages, "
            f"got {type(prompt).__name__}"
        )
    if tokenization.is_messages(prompt) and not all("role" in m for m in prompt):
        raise ConfigError(f"{flag} {where}: every message in {input_key!r} needs a 'role'")
    if label_key is not None and label_key not in record:
        raise ConfigError(
            f"{flag} {where}: no key {label_key!r} (the record has {sorted(record)}); "
            "set --label-key to the key that holds the label, or leave it unset"
        )
    metadata = record.get(metadata_key)
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{flag} {where}: {metadata_key!r} is a string but not JSON ({exc.msg})") from exc
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise ConfigError(f"{flag} {where}: {metadata_key!r} must be an object, got {type(metadata).__name__}")
    metadata = dict(metadata)
    tools = None
    if tool_key and record.get(tool_key) is not None:
        tools = tokenization.parse_tools(record[tool_key], f"{flag} {where} key {tool_key!r}")
        metadata.setdefault("tools", tools)
    return Sample(prompt=prompt, label=record[label_key] if label_key else None, metadata=metadata), tools
