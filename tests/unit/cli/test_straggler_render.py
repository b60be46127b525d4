"""`rtrain status` with a slow rank (docs/stragglers.md): the table's line and the JSON
view's stragglers, from the nodes' status records."""

from __future__ import annotations

import io

from rich.console import Console

from rtrain.cli.render.status import status_view
from rtrain.core.observe.status import JobStatus, NodeStatus, NodeView


def test_rtrain_status_shows_the_straggler_in_its_table_and_its_json() -> None:
    slow = NodeStatus(100.0, "running", (0, 1), (5, 5), stragglers=((1, 2.5, 88.0),))
    view = JobStatus("job", 0, 0, True, 0, (NodeView(0, "10.0.0.1", 2, slow, 0.5),), (), 0)
    assert view.as_json()["stragglers"] == [{"node": 0, "rank": 1, "slower": 2.5, "since": 88.0}]
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(status_view(view))
    assert "straggler: rank 1 on node 0, 2.50x slower than its peers" in console.export_text()
