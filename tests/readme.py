"""Running a README section's commands as a user would: literally, with bash, in a scratch directory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def readme_block(heading: str) -> str:
    """The first ```bash block after `heading` in README.md."""
    section = (REPO_ROOT / "README.md").read_text().split(heading, 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


@contextmanager
def bash_script(cwd: Path, script: str, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen, Path]]:
    """Run `script` (with `set -euo pipefail`) in `cwd`, where `.venv` links to the repository's;
    yield the process and its log file. On exit, whatever the script left running in the
    background (servers, workers) is stopped with it."""
    (cwd / ".venv").symlink_to(REPO_ROOT / ".venv")
    (cwd / "readme.sh").write_text("set -euo pipefail\n" + script)
    log = cwd / "readme.log"  # a file, not a pipe: the background servers keep their output open
    with open(log, "w") as out_file:
        proc = subprocess.Popen(["bash", "readme.sh"], cwd=cwd, env=env, stdout=out_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
