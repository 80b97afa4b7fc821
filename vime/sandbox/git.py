"""An agent session's work as a git diff against the task repository: capture it, restore it.

A session's whole state is `base + diff`: `init_base` commits the clean repository as
`vime-base`, `capture_diff` turns whatever the agent did into one text (stored in workflow
history, graded, used as a checkpoint), and `restore_diff` rebuilds that state in a fresh
sandbox, so a session survives its sandbox (a crashed worker, a reaped workdir).

Every git command goes through `Sandbox.exec`, so this works on any backend, with a fixed
identity and no user/system config (`GIT_ENV`) so base commits and diffs are the same
anywhere. Patches travel through files under `.git/` (never through a command's stdout), so
binary files and non-UTF-8 text survive byte for byte: the diff string decodes bytes that are
not UTF-8 with `surrogateescape`, and `restore_diff` encodes them back the same way. Caches
(`__pycache__/`, `*.pyc`) are ignored through `.git/info/exclude`, never part of a diff.
"""

from __future__ import annotations

import os
import re

from vime.sandbox.base import CommandError, CommandFailed, ExecResult, Sandbox, SandboxError

GIT_ENV = {
    "GIT_AUTHOR_NAME": "vime",
    "GIT_AUTHOR_EMAIL": "vime@example.invalid",
    "GIT_COMMITTER_NAME": "vime",
    "GIT_COMMITTER_EMAIL": "vime@example.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
"""Fixed identity and no user/system config, so base commits and diffs are reproducible anywhere."""

BASE_REF = "vime-base"
"""The tag naming the clean task repository; every diff is taken against it."""

IGNORED = ("__pycache__/", "*.pyc")
"""Never part of a diff: interpreter caches, different on every run."""

_CAPTURE = ".git/vime-capture.diff"
_RESTORE = ".git/vime-restore.diff"
_DIFF_FLAGS = "--binary --no-color --no-ext-diff --no-textconv --no-renames --src-prefix=a/ --dst-prefix=b/"


class PatchDoesNotApply(CommandError):
    """A diff does not apply to the base: task data (a stale or malformed diff), not infra.

    `where` is the first failing hunk (`path:line`) or file git named, None if it named none
    (e.g. no patch in the text at all); `detail` is git's errors on one line.
    """

    def __init__(self, where: str | None, detail: str, result: ExecResult):
        at = f" at {where}" if where else ""
        super().__init__(f"diff does not apply to {BASE_REF}{at}: {detail}")
        self.where, self.detail, self.result = where, detail, result


async def init_base(sbx: Sandbox, *, timeout: float = 120.0) -> None:
    """Make `/workspace` a git repository with everything in it committed and tagged `vime-base`.

    Run it on the clean task repository, before the agent touches anything. A failure here is
    the sandbox's or its image's (no git), never the agent's: `SandboxError`.
    """
    exclude = "\\n".join(IGNORED)
    script = (
        "set -eu\n"
        "git -c init.defaultBranch=main init -q\n"
        f"printf '{exclude}\\n' >> .git/info/exclude\n"
        "git add -A\n"
        f"git commit -q --allow-empty --no-verify --no-gpg-sign -m {BASE_REF}\n"
        f"git tag -f {BASE_REF} >/dev/null\n"
    )
    try:
        await sbx.exec(script, env=GIT_ENV, timeout=timeout, check=True)
    except CommandFailed as e:
        raise SandboxError(
            f"sandbox {sbx.sandbox_id}: cannot commit /workspace as {BASE_REF} (is git installed "
            f"in the sandbox image?): {e}"
        ) from e


async def capture_diff(sbx: Sandbox, *, timeout: float = 120.0) -> str:
    """Every change since `vime-base` (new, modified, deleted and binary files; no caches) as
    one `git apply`-able text; "" when nothing changed.

    Raises `CommandFailed` if git cannot run in the workspace (the agent removed `.git`).
    """
    await sbx.exec(
        f"git add -A && git diff --cached {_DIFF_FLAGS} --output={_CAPTURE} {BASE_REF}",
        env=GIT_ENV,
        timeout=timeout,
        check=True,
    )
    return (await sbx.read_file(_CAPTURE)).decode("utf-8", errors="surrogateescape")


async def restore_diff(sbx: Sandbox, diff: str, *, timeout: float = 120.0) -> None:
    """Put `/workspace` back to exactly `vime-base` + `diff` (what `capture_diff` returned).

    Whatever is there is discarded first (tracked changes, untracked and ignored files), so
    restoring twice is restoring once. Raises `PatchDoesNotApply` if `diff` does not apply;
    the workspace is then at the base (`git apply` applies all of a diff or none of it).
    """
    await sbx.exec(
        f"git reset -q --hard {BASE_REF} && git clean -fdxq", env=GIT_ENV, timeout=timeout, check=True
    )
    if not diff.strip():
        return
    text = diff if diff.endswith("\n") else diff + "\n"
    await sbx.write_file(_RESTORE, text.encode("utf-8", errors="surrogateescape"))
    result = await sbx.exec(
        ["git", "apply", "--binary", "--whitespace=nowarn", _RESTORE], env=GIT_ENV, timeout=timeout
    )
    if not result.ok:
        raise _patch_error(result)


def _patch_error(result: ExecResult) -> PatchDoesNotApply:
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    detail = "; ".join(lines) or f"git apply exited with {result.rc}"
    hunk = re.search(r"patch failed: (\S+:\d+)", detail)
    file = re.search(r"error: (?!patch failed|corrupt patch|No valid patches)([^:;]+): ", detail)
    return PatchDoesNotApply(hunk[1] if hunk else file[1] if file else None, detail, result)
