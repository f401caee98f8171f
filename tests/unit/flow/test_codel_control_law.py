"""CoDel's control law as pure functions (RFC 8289 §5), and the DEBOUNCE_QUEUES setting (§11).

No database: the law runs on a :class:`~django_debounce.flow.codel.CodelState` with
explicit instants, target 5 s and interval 60 s (B40's ``search`` queue).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from django.core.checks import ERROR

from django_debounce.checks import settings as checks
from django_debounce.conf import CodelSettings, parse_queues
from django_debounce.conf import settings as debounce_settings
from django_debounce.exceptions import ConfigurationError
from django_debounce.flow.codel import CodelState, control_law, ok_to_drop, step

T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PARAMS = CodelSettings(target=timedelta(seconds=5), interval=timedelta(minutes=1))


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


# -- the control law -------------------------------------------------------------------------


def test_control_law_spaces_drops_by_interval_over_sqrt_count():
    assert control_law(T, 1, PARAMS.interval) == at(60)
    assert control_law(T, 4, PARAMS.interval) == at(30)
    assert control_law(T, 9, PARAMS.interval) == at(20)
    with pytest.raises(ValueError, match="count=0"):
        control_law(T, 0, PARAMS.interval)


def test_above_target_for_less_than_an_interval_is_not_ok_to_drop():
    state = CodelState()
    assert not ok_to_drop(state, sojourn=s(8), now=T, params=PARAMS)
    assert state.first_above_at == at(60)  # the RFC's first_above_time = now + INTERVAL
    assert not ok_to_drop(state, sojourn=s(30), now=at(59.999), params=PARAMS)
    assert ok_to_drop(state, sojourn=s(30), now=at(60), params=PARAMS)


def test_a_sojourn_below_target_or_a_nearly_empty_queue_resets_the_clock():
    state = CodelState()
    ok_to_drop(state, sojourn=s(8), now=T, params=PARAMS)
    assert not ok_to_drop(state, sojourn=s(4.999), now=at(10), params=PARAMS)
    assert state.first_above_at is None
    ok_to_drop(state, sojourn=s(8), now=at(20), params=PARAMS)
    assert state.first_above_at == at(80)
    assert not ok_to_drop(state, sojourn=s(80), now=at(90), params=PARAMS, nearly_empty=True)
    assert state.first_above_at is None


def test_step_enters_dropping_after_a_full_interval_then_follows_the_law():
    """A standing queue: drops at 60 s, then after 60/√1, 60/√2, 60/√3 … seconds."""
    state = CodelState()
    drops = []
    for second in range(0, 241):
        if step(state, sojourn=s(100), now=at(second), params=PARAMS):
            drops.append(second)
    # Entry drop at 60 (count 1, next at 120); then 120 (count 2, next 120+42.43),
    # 163 (count 3, next 162.43+34.64=197.07), 198 (count 4, next 227.07), 228 (next 253.9).
    assert drops == [60, 120, 163, 198, 228]
    assert state.dropping and state.drop_count == 5
    expected = 120 + 60 / math.sqrt(2) + 60 / math.sqrt(3) + 60 / math.sqrt(4) + 60 / math.sqrt(5)
    assert (state.drop_next_at - T).total_seconds() == pytest.approx(expected, abs=1e-5)


def test_step_leaves_dropping_when_the_sojourn_falls_below_target():
    state = CodelState()
    step(state, sojourn=s(100), now=T, params=PARAMS)
    assert step(state, sojourn=s(100), now=at(60), params=PARAMS)
    assert state.dropping
    assert not step(state, sojourn=s(1), now=at(61), params=PARAMS)
    assert not state.dropping and state.first_above_at is None
    assert state.drop_count == 1  # kept for the RFC's re-entry rule


def test_step_reenters_with_the_last_drop_rate_when_recent():
    """RFC 8289 §5: re-entering soon after a state that dropped more than once starts
    from count − lastcount, not from 1."""
    state = CodelState(
        dropping=False,
        first_above_at=at(0),
        drop_next_at=at(-30),
        drop_count=7,
        last_drop_count=2,
    )
    assert step(state, sojourn=s(100), now=at(0), params=PARAMS)
    assert state.dropping and state.drop_count == 5 and state.last_drop_count == 5
    assert (state.drop_next_at - T).total_seconds() == pytest.approx(60 / math.sqrt(5), abs=1e-5)

    stale = CodelState(
        first_above_at=at(0), drop_next_at=at(-16 * 60), drop_count=7, last_drop_count=2
    )
    assert step(stale, sojourn=s(100), now=at(0), params=PARAMS)
    assert stale.drop_count == 1 and stale.drop_next_at == at(60)


def test_a_job_that_may_not_be_shed_runs_and_the_drop_waits_for_the_next_droppable_one():
    state = CodelState()
    step(state, sojourn=s(100), now=T, params=PARAMS)
    # At 60 s the law would drop, but the job is a "defer" task: it runs, nothing advances.
    assert not step(state, sojourn=s(100), now=at(60), params=PARAMS, droppable=False)
    assert not state.dropping and state.drop_count == 0
    # The next droppable job takes the drop.
    assert step(state, sojourn=s(100), now=at(61), params=PARAMS)
    assert state.dropping and state.drop_count == 1 and state.drop_next_at == at(121)
    # While dropping, a due drop also skips a non-droppable job.
    assert not step(state, sojourn=s(100), now=at(121), params=PARAMS, droppable=False)
    assert state.drop_count == 1
    assert step(state, sojourn=s(100), now=at(121), params=PARAMS)
    assert state.drop_count == 2


def test_one_claim_instant_drops_only_while_the_schedule_is_due():
    """Several jobs of one claim share ``now``: after a drop the next is due later."""
    state = CodelState()
    step(state, sojourn=s(100), now=T, params=PARAMS)
    verdicts = [step(state, sojourn=s(100), now=at(60), params=PARAMS) for _ in range(5)]
    assert verdicts == [True, False, False, False, False]


def test_a_stale_drop_schedule_resumes_instead_of_catching_up():
    """No claim for an hour while dropping: one claim sheds a handful, not thousands."""
    state = CodelState(
        dropping=True, first_above_at=at(-3600), drop_next_at=at(-3600), drop_count=3
    )
    drops = sum(step(state, sojourn=s(4000), now=T, params=PARAMS) for _ in range(1000))
    # Resumed at now − interval: drops until the spacing 60/√4 + 60/√5 + … passes 60 s.
    assert drops == 3
    assert state.drop_next_at > T


# -- DEBOUNCE_QUEUES ---------------------------------------------------------------------------


def test_parse_queues_reads_codel_durations():
    parsed = parse_queues(
        {
            "default": {"codel": {"target": "500ms", "interval": "5s"}},
            "search": {"codel": {"target": 5, "interval": timedelta(minutes=1)}},
            "mail": {},
            "reports": {"codel": None},
        }
    )
    assert parsed == {
        "default": CodelSettings(target=s(0.5), interval=s(5)),
        "search": CodelSettings(target=s(5), interval=s(60)),
    }
    assert parse_queues({}) == {} and parse_queues(None) == {}


def test_settings_codel_is_read_when_used(settings):
    assert debounce_settings.codel == {}
    settings.DEBOUNCE_QUEUES = {"search": {"codel": {"target": "5s", "interval": "1m"}}}
    assert debounce_settings.codel == {"search": PARAMS}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["default"], "must be a dict of queue name"),
        ({"": {}}, "non-empty str"),
        ({"default": "codel"}, "must be a dict of options"),
        ({"default": {"codle": {}}}, r"unknown option\(s\) \['codle'\]"),
        ({"default": {"codel": "500ms"}}, "must be a dict like"),
        ({"default": {"codel": {"target": "500ms"}}}, r"missing: \['interval'\]"),
        (
            {"default": {"codel": {"target": "1s", "interval": "5s", "limit": 3}}},
            r"unknown: \['limit'\]",
        ),
        ({"default": {"codel": {"target": 0, "interval": "5s"}}}, "longer than zero"),
        ({"default": {"codel": {"target": "1s", "interval": "soon"}}}, "is not a duration"),
        ({"default": {"codel": {"target": "5s", "interval": "5s"}}}, "must be shorter than"),
        ({"default": {"codel": {"target": "1m", "interval": "5s"}}}, "must be shorter than"),
    ],
)
def test_parse_queues_rejects_bad_values_with_a_clear_error(value, message):
    with pytest.raises(ConfigurationError, match=message):
        parse_queues(value)


def test_check_e012_reports_a_bad_queues_setting(settings):
    settings.DEBOUNCE_QUEUES = {"default": {"codel": {"target": "5s", "interval": "1s"}}}
    messages = checks.check_settings()
    assert [m.id for m in messages] == ["django_debounce.E012"]
    (message,) = messages
    assert message.level == ERROR
    assert "DEBOUNCE_QUEUES['default']" in message.msg
    assert message.hint

    settings.DEBOUNCE_QUEUES = {"default": {"codel": {"target": "500ms", "interval": "5s"}}}
    assert checks.check_settings() == []
