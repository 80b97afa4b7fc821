"""`FromFlags`: a config dataclass whose every field is a `vime` flag of the same name.

`from_args` reads each field from `args` by name, so a flag renamed (or dropped) without its
config field fails at the trainer's start, naming the field, instead of training quietly on the
field's default. tests/test_flag_math.py checks that every field is a declared flag.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T", bound="FromFlags")


class FromFlags:
    """Mixin for dataclasses: `from_args(args)` fills every field from `args.<field>`."""

    @classmethod
    def from_args(cls: type[T], args: Any) -> T:
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        missing = [n for n in names if not hasattr(args, n)]
        if missing:
            flags = ", ".join("--" + n.replace("_", "-") for n in missing)
            raise AttributeError(f"{cls.__name__}.from_args: args has no {', '.join(missing)} ({flags}); "
                                 "build args with vime.config.args.parse_args, or rename the field with its flag")
        return cls(**{n: getattr(args, n) for n in names})
