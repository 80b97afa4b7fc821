"""Weights & Biases: every metrics line as one W&B history row at the line's step, grouped tags,
with slime's flags (`--use-wandb`, `--wandb-project`, `--wandb-group`, `--wandb-team`,
`--wandb-mode`, `--wandb-dir`, `--wandb-key`, `--wandb-host`, `--wandb-run-id`).

One vime run is one W&B run, also across relaunches: its id (`--wandb-run-id`, else one made at the
first line) and the last step it logged are kept in `<run_dir>/wandb-run.json`, so a resumed run
continues the same W&B run (`resume="allow"`) and sends only the lines W&B does not have yet.
Offline mode (`--wandb-mode offline` or `WANDB_MODE=offline`) needs no network: each launch's rows
wait under `<wandb-dir>/wandb/offline-run-*-<id>/` for `wandb sync`, which joins them into that run.

The worker that writes the lines may serve several runs at once, so each W&B run is its own
(`reinit="create_new"`), its settings passed to it rather than set process-wide (no `wandb.login`,
no `WANDB_*` variables changed), and W&B does not capture the worker's console.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime.metrics.tags import figures

STATE_FILE = "wandb-run.json"
DEFAULT_PROJECT = "vime"


@dataclass(frozen=True)
class WandbConfig:
    """The W&B settings of one run, read from its flags (slime's names)."""

    name: str
    project: str | None = None
    group: str | None = None
    team: str | None = None
    mode: str | None = None
    dir: str | None = None
    key: str | None = None
    host: str | None = None
    run_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_args(cls, args: Any) -> WandbConfig:
        """From a run's parsed flags; the run's flags become the W&B config, less the key (and the
        command line, which may hold it)."""
        flags = {k: v for k, v in args.to_dict().items() if k not in ("wandb_key", "argv")}
        return cls(name=args.run_id, project=args.wandb_project, group=args.wandb_group, team=args.wandb_team,
                   mode=args.wandb_mode, dir=args.wandb_dir, key=args.wandb_key, host=args.wandb_host,
                   run_id=args.wandb_run_id, config=json.loads(json.dumps(flags, default=str)))

    def settings(self) -> dict[str, Any]:
        """`wandb.Settings` fields: the run's own, never the process's."""
        out: dict[str, Any] = {"console": "off", "save_code": False, "disable_git": True}
        for name, value in (("mode", self.mode), ("api_key", self.key), ("base_url", self.host)):
            if value:
                out[name] = value
        return out


class WandbSink:
    def __init__(self, run_dir: str | Path, config: WandbConfig) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        state = self._state()
        self.run_id = config.run_id or state.get("id") or secrets.token_hex(4)
        self.last_step: int | None = state.get("step") if state.get("id") == self.run_id else None
        self._run = None

    def _state(self) -> dict:
        path = self.run_dir / STATE_FILE
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _save_state(self) -> None:
        path = self.run_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"id": self.run_id, "step": self.last_step}))
        os.replace(tmp, path)

    def written(self, step: int) -> bool:
        """W&B has the step: its run logged it or a later one (W&B keeps steps increasing)."""
        return self.last_step is not None and step <= self.last_step

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if self.written(step):
            return
        if self._run is None:
            self._run = self._start()
        self._run.log(figures(metrics), step=step)
        self.last_step = step
        self._save_state()

    def _start(self):
        import wandb

        directory = Path(self.config.dir or self.run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._save_state()  # the id is the run's from its first line on, even if no row gets through
        c = self.config
        return wandb.init(id=self.run_id, name=c.name, project=c.project or DEFAULT_PROJECT, entity=c.team,
                          group=c.group, dir=str(directory), config=c.config, resume="allow",
                          reinit="create_new", settings=wandb.Settings(**c.settings()))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
