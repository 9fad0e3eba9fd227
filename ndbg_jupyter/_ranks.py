"""The rank selector of a multi-process run: which rank's layers the grid and the chart show.

Shown only for a merged run (``%neuraldbg load run_dir``); the explanation panel always holds the
run's verdict, whose hypotheses name their rank. A rank where a confident hypothesis starts is marked.
"""
from __future__ import annotations

from typing import Callable

import ipywidgets as widgets


class RankSelector:
    """Toggle buttons, one per rank with a trace; ``update(dbg)`` shows a session's ranks (hidden for one)."""

    def __init__(self, on_change: Callable[[int], None]):
        self.on_change = on_change
        self.widget = widgets.ToggleButtons(options=[], description="rank",
                                            tooltip="the rank whose layers the grid and chart show",
                                            style={"button_width": "6em", "description_width": "3em"},
                                            layout=widgets.Layout(display="none"))
        self.widget.add_class("ndbg-ranks")
        self.widget.observe(self._changed, names="value")
        self._quiet = False

    @property
    def visible(self) -> bool:
        return self.widget.layout.display != "none"

    def update(self, dbg) -> None:
        ranks = list(getattr(dbg, "ranks", None) or [])
        multi = len(ranks) > 1
        flagged = {h.rank for h in dbg.explain().confident} if multi else set()
        self._quiet = True
        try:
            with self.widget.hold_sync():
                self.widget.options = [(f"rank {r}" + (" \u26a0" if r in flagged else ""), r) for r in ranks]
                if multi:
                    self.widget.value = dbg.rank
                self.widget.layout.display = "" if multi else "none"
        finally:
            self._quiet = False

    def _changed(self, change) -> None:
        if not self._quiet and change["new"] is not None:
            self.on_change(int(change["new"]))
