"""User hooks: load a function from a dotted path, call it by what its signature accepts.

slime users point flags like `--custom-rm-path` at `pkg.mod.fn`; vime does the same (and also
accepts `pkg.mod:fn`). Every failure to load is a `ConfigError` that names the flag, the path and
what exactly is missing, because a hook typo otherwise surfaces minutes later inside a worker.

Hooks are called tolerantly, as slime does: required positional arguments are always passed,
optional keywords (`evaluation=True`, ...) only when the hook declares them or takes `**kwargs`,
so a hook written for an older signature keeps working.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from vime.errors import ConfigError


def split_path(path: str, flag: str) -> tuple[str, str]:
    """`pkg.mod.fn` -> ("pkg.mod", "fn"); `pkg.mod:obj.fn` -> ("pkg.mod", "obj.fn")."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{flag} {path!r}: expected a dotted path like 'pkg.module.function'")
    if ":" in path:
        module, _, attr = path.partition(":")
    else:
        module, _, attr = path.rpartition(".")
    parts = [*module.split("."), *attr.split(".")]
    if not module or not attr or not all(p.isidentifier() for p in parts):
        raise ConfigError(
            f"{flag} {path!r}: expected a dotted path like 'pkg.module.function' (or 'pkg.module:function')"
        )
    return module, attr


def _import(module: str, flag: str, path: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and module != missing and not module.startswith(missing + "."):
            # The module exists but imports something that is not installed.
            raise ConfigError(
                f"{flag} {path!r}: module {module!r} was found but failed to import: {exc} "
                f"(a dependency of {module!r} is missing; install it)"
            ) from exc
        if _add_cwd_to_path():
            return _import(module, flag, path)
        raise ConfigError(f"{flag} {path!r}: cannot import module {module!r}: {exc}") from exc
    except ImportError as exc:
        raise ConfigError(f"{flag} {path!r}: module {module!r} failed to import: {exc}") from exc
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module
        raise ConfigError(f"{flag} {path!r}: syntax error in {where}: {exc.msg}") from exc


def _add_cwd_to_path() -> bool:
    """Make the working directory importable (last), as `python train.py` from a repo root would.

    The `vime` console script does not put the working directory on sys.path, yet slime
    users write `--custom-rm-path examples.my_task.reward` from their repository root.
    """
    cwd = os.getcwd()
    if cwd in sys.path or "" in sys.path:
        return False
    sys.path.append(cwd)
    importlib.invalidate_caches()
    return True


def load_function(path: str, flag: str) -> Callable[..., Any]:
    """Import the callable that `flag` names by `path`; any failure is a `ConfigError` naming both.

    An exception other than an import or syntax error raised while the user's module runs
    propagates as is: it is a bug in that module and its traceback is what the user needs.
    """
    module_name, attr = split_path(path, flag)
    obj: Any = _import(module_name, flag, path)
    owner = module_name
    for name in attr.split("."):
        if not hasattr(obj, name):
            kind = "module" if inspect.ismodule(obj) else "object"
            raise ConfigError(f"{flag} {path!r}: {kind} {owner!r} has no attribute {name!r}")
        obj = getattr(obj, name)
        owner = f"{owner}.{name}"
    if not callable(obj):
        raise ConfigError(f"{flag} {path!r}: {attr!r} is not callable (it is a {type(obj).__name__})")
    return obj


def load_hook(args: Any, dest: str) -> Callable[..., Any] | None:
    """The hook configured by `args.<dest>` (e.g. "custom_rm_path"), or None when the flag is unset."""
    path = getattr(args, dest)
    if path is None:
        return None
    return load_function(path, "--" + dest.replace("_", "-"))


@functools.lru_cache(maxsize=1024)
def _accepted_keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    """Names `fn` accepts as keywords; None means any (`**kwargs`); no readable signature means none."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params if p.kind in kinds)


def accepted_keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    """Cached where `fn` is hashable (functions, methods, most callables)."""
    try:
        return _accepted_keywords(fn)
    except TypeError:  # unhashable callable object
        return _accepted_keywords.__wrapped__(fn)


def call_hook(fn: Callable[..., Any], *args: Any, **optional: Any) -> Any:
    """Call `fn(*args)`, adding each of `optional` only if `fn` declares it (or takes **kwargs).

    Returns what `fn` returns, awaitable or not; see `call_hook_async`.
    """
    accepted = accepted_keywords(fn)
    kwargs = optional if accepted is None else {k: v for k, v in optional.items() if k in accepted}
    return fn(*args, **kwargs)


async def call_hook_async(fn: Callable[..., Any], *args: Any, **optional: Any) -> Any:
    """`call_hook`, awaiting the result when the hook is async (or returns an awaitable)."""
    result = call_hook(fn, *args, **optional)
    if inspect.isawaitable(result):
        result = await result
    return result
