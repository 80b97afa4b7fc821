"""`vime ui RUN`: the Temporal Web UI on a run's own history, after the run (or between launches).

`vime train` serves the UI only while it runs. This starts a Temporal dev server with UI on the
run's `<run-dir>/temporal.db` and waits for Ctrl-C. It holds the run directory's lock meanwhile:
a `vime train` of the same run waits for it to close, so two servers never share the database.
Each rollout group's workflow shows its samples (reward, status, prompt and response) in its memo.
"""

from __future__ import annotations

import json
import signal
import threading
import urllib.parse

from vime.errors import ConfigError
from vime.ops.commands import run_parser
from vime.ops.locate import run_dir_of
from vime.rundir import RunDirLock
from vime.temporal.dev_server import TemporalDevServer


def runs_url(ui_url: str, run_id: str) -> str:
    """The UI's list of the run's workflows (the training workflow and every group)."""
    query = urllib.parse.quote(f"VimeRunId='{run_id}'")
    return f"{ui_url}/namespaces/default/workflows?query={query}"


def ui_main(argv: list[str]) -> int:
    parser = run_parser("vime ui", "The Temporal Web UI on a run's history (<run-dir>/temporal.db), until Ctrl-C.")
    parser.add_argument("--ui-port", type=int, help="the UI's port (default: a free one)")
    args = parser.parse_args(argv)
    run_dir = run_dir_of(args.run, args.run_dir)
    if not (run_dir / "temporal.db").is_file():
        raise ConfigError(f"no Temporal history in {str(run_dir)!r} (no temporal.db): the run ran against another "
                          "Temporal (--temporal-address); open that server's UI instead, or pass the run's --run-dir")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where a shell started us ignoring it
    with RunDirLock(run_dir), TemporalDevServer(run_dir, ui_port=args.ui_port) as server:
        url = runs_url(server.ui_url, args.run)
        print(f"[vime] Web UI for run {args.run}: {url} (Temporal at {server.address})" if not args.json
              else json.dumps({"ui": url, "temporal": server.address}), flush=True)
        print("[vime] Ctrl-C closes it", flush=True)
        try:
            while not stop.wait(1.0):
                if not server.alive():
                    raise ConfigError(f"the Temporal dev server stopped; see {server.log_path}")
        except KeyboardInterrupt:
            pass
    return 0
