"""Hooks by dotted path: each way loading can fail is reported against the flag that named it,
and hooks are called with only the optional keywords they declare."""

from __future__ import annotations

import itertools
import sys
import textwrap
from types import SimpleNamespace

import pytest

from vime.errors import ConfigError
from vime.plugins import (
    accepted_keywords,
    call_hook,
    call_hook_async,
    load_function,
    load_hook,
    split_path,
)

_ids = itertools.count()


@pytest.fixture
def make_module(tmp_path, monkeypatch):
    """Write `source` as `<fresh package>.mod` on sys.path and return the module's dotted name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(source: str) -> str:
        package = f"hookpkg_{next(_ids)}"
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "mod.py").write_text(textwrap.dedent(source))
        return f"{package}.mod"

    return make


def load_error(path: str, flag: str = "--custom-rm-path") -> str:
    with pytest.raises(ConfigError) as info:
        load_function(path, flag)
    return str(info.value)


# ---------------------------------------------------------------- loading


def test_dotted_and_colon_paths_load_the_same_function(make_module):
    mod = make_module("def rm(args, sample):\n    return 1.0\n")
    assert load_function(f"{mod}.rm", "--custom-rm-path") is load_function(f"{mod}:rm", "--custom-rm-path")
    assert load_function(f"{mod}.rm", "--custom-rm-path")(None, None) == 1.0


def test_colon_path_reaches_attributes_of_objects(make_module):
    mod = make_module("""
        class Source:
            @staticmethod
            def build(args):
                return "built"
    """)
    assert load_function(f"{mod}:Source.build", "--data-source-path")(None) == "built"
    assert load_function(f"{mod}.Source", "--data-source-path").__name__ == "Source"  # classes are callables


@pytest.mark.parametrize("path", ["rm", "", "pkg.", ".rm", "pkg.mod:", ":rm", "pkg mod.rm", "pkg.1mod.rm"])
def test_malformed_paths_are_rejected_before_importing(path):
    message = load_error(path)
    assert message.startswith(f"--custom-rm-path {path!r}: expected a dotted path like 'pkg.module.function'")


def test_split_path():
    assert split_path("pkg.mod.fn", "--flag") == ("pkg.mod", "fn")
    assert split_path("pkg.mod:Cls.fn", "--flag") == ("pkg.mod", "Cls.fn")


def test_missing_module_names_what_is_missing():
    assert load_error("no_such_pkg_xyz.reward.rm") == (
        "--custom-rm-path 'no_such_pkg_xyz.reward.rm': cannot import module 'no_such_pkg_xyz.reward': "
        "No module named 'no_such_pkg_xyz'"
    )


def test_missing_submodule_names_the_submodule(make_module):
    package = make_module("").split(".")[0]
    assert load_error(f"{package}.nope.rm") == (
        f"--custom-rm-path '{package}.nope.rm': cannot import module '{package}.nope': "
        f"No module named '{package}.nope'"
    )


def test_missing_attribute(make_module):
    mod = make_module("def other(args, sample):\n    return 0.0\n")
    assert load_error(f"{mod}.rm") == f"--custom-rm-path '{mod}.rm': module '{mod}' has no attribute 'rm'"
    assert load_error(f"{mod}:other.inner") == (
        f"--custom-rm-path '{mod}:other.inner': object '{mod}.other' has no attribute 'inner'"
    )


def test_not_callable(make_module):
    mod = make_module("rm = 0.5\n")
    assert load_error(f"{mod}.rm") == f"--custom-rm-path '{mod}.rm': 'rm' is not callable (it is a float)"


def test_a_missing_dependency_of_the_users_module_is_not_reported_as_a_missing_module(make_module):
    mod = make_module("import definitely_missing_dep_xyz\n\ndef rm(args, sample):\n    return 0.0\n")
    message = load_error(f"{mod}.rm")
    assert f"module '{mod}' was found but failed to import" in message
    assert "No module named 'definitely_missing_dep_xyz'" in message
    assert "cannot import module" not in message


def test_other_import_errors_inside_the_users_module(make_module):
    mod = make_module("from os import no_such_name\n")
    message = load_error(f"{mod}.rm")
    assert message.startswith(f"--custom-rm-path '{mod}.rm': module '{mod}' failed to import: cannot import name")


def test_syntax_error_names_the_file_and_line(make_module):
    mod = make_module("def rm(args, sample)\n    return 0.0\n")
    message = load_error(f"{mod}.rm")
    assert "syntax error in " in message and "mod.py:1" in message


def test_a_bug_in_the_users_module_keeps_its_own_exception(make_module):
    """Not a config problem: the user needs the traceback, so it is not turned into a ConfigError."""
    mod = make_module("raise RuntimeError('boom at import')\n")
    with pytest.raises(RuntimeError, match="boom at import"):
        load_function(f"{mod}.rm", "--custom-rm-path")


def test_working_directory_is_importable_like_python_train_py(tmp_path, monkeypatch):
    """slime users pass paths relative to the repository they run from; the `vime` script must find them."""
    (tmp_path / "cwd_hooks_xyz.py").write_text("def rm(args, sample):\n    return 2.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_function("cwd_hooks_xyz.rm", "--custom-rm-path")(None, None) == 2.0


def test_load_hook_is_none_when_the_flag_is_unset(make_module):
    mod = make_module("def rm(args, sample):\n    return 1.0\n")
    assert load_hook(SimpleNamespace(custom_rm_path=None), "custom_rm_path") is None
    assert load_hook(SimpleNamespace(custom_rm_path=f"{mod}.rm"), "custom_rm_path")(None, None) == 1.0
    with pytest.raises(ConfigError, match="^--buffer-filter-path 'nope': expected a dotted path"):
        load_hook(SimpleNamespace(buffer_filter_path="nope"), "buffer_filter_path")


# ---------------------------------------------------------------- calling


def generate_old(args, sample, sampling_params):
    return ("old", sampling_params)


def generate_new(args, sample, sampling_params, evaluation=False):
    return ("new", evaluation)


def generate_kwargs(args, sample, sampling_params, **kwargs):
    return ("kwargs", kwargs)


def generate_kwonly(args, sample, sampling_params, *, evaluation=False):
    return ("kwonly", evaluation)


@pytest.mark.parametrize(
    "hook, expected",
    [
        (generate_old, ("old", {"temperature": 1.0})),
        (generate_new, ("new", True)),
        (generate_kwargs, ("kwargs", {"evaluation": True, "rollout_id": 7})),
        (generate_kwonly, ("kwonly", True)),
    ],
)
def test_optional_keywords_are_passed_only_when_declared(hook, expected):
    assert call_hook(hook, "args", "sample", {"temperature": 1.0}, evaluation=True, rollout_id=7) == expected


def test_required_positionals_are_always_passed():
    with pytest.raises(TypeError):
        call_hook(lambda args: args, "args", "sample")


def test_signature_inspection_is_cached():
    from vime.plugins import _accepted_keywords

    call_hook(generate_new, 1, 2, 3, evaluation=True)
    hits = _accepted_keywords.cache_info().hits
    call_hook(generate_new, 1, 2, 3, evaluation=True)
    assert _accepted_keywords.cache_info().hits == hits + 1


def test_unhashable_callables_still_work():
    class Hook:
        __hash__ = None

        def __call__(self, args, sample, evaluation=False):
            return evaluation

    assert call_hook(Hook(), 1, 2, evaluation=True) is True
    assert call_hook(Hook(), 1, 2, unknown=True) is False


def test_callables_without_a_readable_signature_get_positionals_only():
    assert accepted_keywords(max) == frozenset()  # max has no introspectable signature
    assert call_hook(max, 3, 5, evaluation=True) == 5


async def test_async_hooks_are_awaited():
    async def rm(args, sample, evaluation=False):
        return 0.5 if evaluation else 1.0

    assert await call_hook_async(rm, None, None) == 1.0
    assert await call_hook_async(rm, None, None, evaluation=True) == 0.5


async def test_sync_hooks_work_from_async_code():
    def rm(args, sample):
        return 3.0

    assert await call_hook_async(rm, None, None, evaluation=True) == 3.0


async def test_sync_hooks_returning_awaitables_are_awaited():
    async def inner():
        return [1.0, 0.0]

    def group_rm(args, samples):
        return inner()

    assert await call_hook_async(group_rm, None, []) == [1.0, 0.0]
