"""The driver's attach lifecycle: one state, legal moves as data, an illegal move named."""

from __future__ import annotations

import pytest

from agui_adapter.run.detached import Unattended
from agui_adapter.run.lifecycle import MOVES, RUNNING, STOPPING, Attach, IllegalMove, Lifecycle


def test_a_run_whose_client_left_goes_on_detached_then_is_abandoned_then_ends() -> None:
    life = Lifecycle()
    assert life.state is Attach.NEW
    assert life.move(Attach.ATTACHED) is Attach.NEW
    life.move(Attach.DETACHED)
    life.move(Attach.ABANDONED)
    assert life.state in STOPPING
    life.move(Attach.ENDED)
    assert life.state is Attach.ENDED


def test_an_illegal_move_raises_naming_both_states() -> None:
    life = Lifecycle(Attach.HANDED_OVER)
    with pytest.raises(IllegalMove) as raised:
        life.move(Attach.ATTACHED)
    assert "'handed over'" in str(raised.value) and "'attached'" in str(raised.value)
    assert life.state is Attach.HANDED_OVER  # unchanged


def test_nothing_follows_the_end_and_everything_may_end() -> None:
    assert MOVES[Attach.ENDED] == frozenset()
    assert all(Attach.ENDED in MOVES[state] for state in Attach if state is not Attach.ENDED)
    assert set(MOVES) == set(Attach)
    reached = {moved for moves in MOVES.values() for moved in moves}
    assert reached | {Attach.NEW, Attach.DETACHED} == set(Attach)  # NEW: admitted; DETACHED: adopted


def test_a_shutdown_after_the_run_stopped_is_no_move() -> None:
    life = Lifecycle(Attach.ATTACHED)
    assert life.move_if(RUNNING, Attach.SHUTTING_DOWN)
    assert not life.move_if(RUNNING, Attach.HANDING_OVER)  # asked twice: the first stands
    assert life.state is Attach.SHUTTING_DOWN
    assert not Lifecycle(Attach.ENDED).move_if(RUNNING, Attach.SHUTTING_DOWN)


def test_a_client_that_leaves_after_a_shutdown_does_not_detach_the_run() -> None:
    life = Lifecycle(Attach.ATTACHED)
    life.move_if(RUNNING, Attach.SHUTTING_DOWN)
    assert not life.move_if((Attach.ATTACHED,), Attach.DETACHED)


def test_the_grace_period_counts_from_the_last_reader_leaving_on_the_clock_given() -> None:
    now = [100.0]
    unattended = Unattended(5.0, lambda: now[0])
    assert not unattended.over(followed=True)
    assert not unattended.over(followed=False)  # nobody from now on
    now[0] += 4.9
    assert not unattended.over(followed=False)
    assert not unattended.over(followed=True)  # a reader came back: counting starts again
    now[0] += 10
    assert not unattended.over(followed=False)
    now[0] += 5
    assert unattended.over(followed=False)
