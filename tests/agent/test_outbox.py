"""The agent's outbox: results waiting to be delivered, and entries held for a batch."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tests.support.sweeps import result_for


def test_a_held_entry_is_left_to_its_run_by_the_backlog_delivery(tmp_path) -> None:
    """A device delivering the backlog before its claim must not send, alone, the entry a run
    has just handed to a batch; once released (its batch failed, say) it is backlog again."""
    import threading

    from agent.outbox import Outbox
    from decodebench.contracts.protocol import ResultsBatchStored, UploadOutcome
    from decodebench.contracts.results import RunResult

    outbox = Outbox(tmp_path / "outbox")
    result = RunResult.model_validate(result_for(range(3), 40.0, udid="SIM-0000"))
    held = outbox.put(7, result, hold=True)
    old = outbox.put(8, result)  # left by an earlier process
    sent: list[int] = []
    stop = threading.Event()

    def send(uploads: Sequence[str]) -> ResultsBatchStored:
        run_ids = [json.loads(upload)["run_id"] for upload in uploads]
        sent.extend(run_ids)
        return ResultsBatchStored(outcomes=[UploadOutcome(run_id=i, status=200) for i in run_ids])

    assert outbox.deliver(send, stop)
    assert sent == [8] and held.exists() and not old.exists()
    outbox.release(held)
    assert outbox.deliver(send, stop)
    assert sent == [8, 7] and not outbox.pending()
