"""A simulated calendar: events on dates, working hours, no double booking.

Dates are `YYYY-MM-DD`, times `HH:MM` (24 h); events may not overlap and must fit in the
working hours (09:00-17:00 by default). Tools: list_events, create_event, delete_event,
find_free_slot. Templates: book a meeting in the first free slot of a day, cancel a meeting and
report who was invited, move a meeting to another time.
"""

from __future__ import annotations

import contextlib
import datetime
import random
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from k2post.toolsets.base import ToolError, Toolset, ToolsetState, tool_spec
from k2post.toolsets.checks import Checkpoint, Scenario, called, expect, ref_call

_DATE = {"type": "string", "description": "Date as YYYY-MM-DD."}
_TIME = {"type": "string", "description": "Time as HH:MM (24 h)."}
_DURATION = {"type": "integer", "minimum": 5, "maximum": 480, "description": "Length in minutes."}
_TIME_PATTERN = re.compile(r"\s*(\d{1,2}):(\d{2})\s*")


class Event(BaseModel):
    """One calendar event."""

    id: str = Field(description="Event id, e.g. evt-3.")
    title: str = Field(description="Title.")
    date: str = Field(description="YYYY-MM-DD.")
    start: str = Field(description="HH:MM.")
    duration_minutes: int = Field(description="Length in minutes.")
    attendees: list[str] = Field(default_factory=list, description="Invited people.")


class CalendarState(ToolsetState):
    """Events plus the id counter and working hours."""

    toolset: Literal["calendar"] = "calendar"
    events: list[Event] = Field(default_factory=list, description="All events.")
    next_id: int = Field(1, description="Number of the next event id.")
    day_start: str = Field("09:00", description="Start of working hours.")
    day_end: str = Field("17:00", description="End of working hours.")


def parse_time(raw: str) -> int:
    """Minutes after midnight of `HH:MM`."""
    match = _TIME_PATTERN.fullmatch(raw)
    if match is None or int(match.group(1)) > 23 or int(match.group(2)) > 59:
        raise ToolError(f"time {raw!r} is not HH:MM")
    return int(match.group(1)) * 60 + int(match.group(2))


def format_time(minutes: int) -> str:
    """`HH:MM` of minutes after midnight."""
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def parse_date(raw: str) -> str:
    """The ISO form of a `YYYY-MM-DD` date."""
    try:
        return datetime.date.fromisoformat(raw.strip()).isoformat()
    except ValueError:
        raise ToolError(f"date {raw!r} is not YYYY-MM-DD") from None


def day_events(state: CalendarState, date: str) -> list[Event]:
    """Events on `date`, by start time."""
    return sorted((e for e in state.events if e.date == date), key=lambda e: parse_time(e.start))


def free_slot(state: CalendarState, date: str, duration: int, after: int = 0) -> int | None:
    """Start (minutes) of the first gap of `duration` minutes on `date` at or after `after`."""
    cursor = max(parse_time(state.day_start), after)
    for event in day_events(state, date):
        start = parse_time(event.start)
        if start - cursor >= duration:
            return cursor
        cursor = max(cursor, start + event.duration_minutes)
    return cursor if parse_time(state.day_end) - cursor >= duration else None


def _describe(event: Event) -> str:
    end = format_time(parse_time(event.start) + event.duration_minutes)
    people = ", ".join(event.attendees) or "none"
    return f"{event.id} | {event.date} {event.start}-{end} | {event.title} | attendees: {people}"


def _conflict(state: CalendarState, date: str, start: int, duration: int) -> Event | None:
    for event in day_events(state, date):
        other = parse_time(event.start)
        if start < other + event.duration_minutes and other < start + duration:
            return event
    return None


class CalendarToolset(Toolset):
    """Tools over a CalendarState."""

    name: ClassVar[str] = "calendar"
    description: ClassVar[str] = "a calendar"
    context: ClassVar[str] = "Today is Monday 2025-03-03. Working hours are 09:00-17:00."
    state_cls: ClassVar[type[ToolsetState]] = CalendarState
    specs = (
        tool_spec("list_events", "List the events of a date.", {"date": _DATE}, ["date"]),
        tool_spec(
            "create_event",
            "Create an event; it must fit in working hours and not overlap another event.",
            {
                "title": {"type": "string", "minLength": 1, "description": "Title."},
                "date": _DATE,
                "start": _TIME,
                "duration_minutes": _DURATION,
                "attendees": {
                    "type": "array",
                    "items": {"type": "string"},
                    "default": [],
                    "description": "Invitees.",
                },
            },
            ["title", "date", "start", "duration_minutes"],
        ),
        tool_spec(
            "delete_event",
            "Delete an event by id.",
            {"event_id": {"type": "string", "description": "e.g. evt-3"}},
            ["event_id"],
        ),
        tool_spec(
            "find_free_slot",
            "Find the earliest free slot of a given length on a date, within working hours.",
            {
                "date": _DATE,
                "duration_minutes": _DURATION,
                "after": {**_TIME, "default": "00:00", "description": "Not before this time."},
            },
            ["date", "duration_minutes"],
        ),
    )

    def canonical_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        canonical = dict(arguments)
        for key, parse, fmt in (
            ("date", parse_date, str),
            ("start", parse_time, format_time),
            ("after", parse_time, format_time),
        ):
            if isinstance(canonical.get(key), str):
                with contextlib.suppress(ToolError):
                    canonical[key] = fmt(parse(canonical[key]))
        return canonical

    def tool_list_events(self, state: CalendarState, date: str) -> str:
        events = day_events(state, parse_date(date))
        return "\n".join(_describe(e) for e in events) if events else f"No events on {parse_date(date)}"

    def tool_create_event(
        self,
        state: CalendarState,
        title: str,
        date: str,
        start: str,
        duration_minutes: float,
        attendees: list[str],
    ) -> str:
        day, begin, length = parse_date(date), parse_time(start), int(duration_minutes)
        if begin < parse_time(state.day_start) or begin + length > parse_time(state.day_end):
            raise ToolError(f"outside working hours {state.day_start}-{state.day_end}")
        clash = _conflict(state, day, begin, length)
        if clash is not None:
            raise ToolError(f"overlaps {_describe(clash)}")
        event = Event(
            id=f"evt-{state.next_id}",
            title=title,
            date=day,
            start=format_time(begin),
            duration_minutes=length,
            attendees=list(attendees),
        )
        state.events.append(event)
        state.next_id += 1
        return f"Created {_describe(event)}"

    def tool_delete_event(self, state: CalendarState, event_id: str) -> str:
        event = next((e for e in state.events if e.id == event_id.strip()), None)
        if event is None:
            raise ToolError(f"no event with id {event_id!r}")
        state.events.remove(event)
        return f"Deleted {_describe(event)}"

    def tool_find_free_slot(self, state: CalendarState, date: str, duration_minutes: float, after: str) -> str:
        day, length = parse_date(date), int(duration_minutes)
        start = free_slot(state, day, length, parse_time(after))
        if start is None:
            return f"No free {length}-minute slot on {day}"
        slot = f"{format_time(start)}-{format_time(start + length)}"
        return f"Earliest free {length}-minute slot on {day}: {slot}"


# --- task templates -----------------------------------------------------------------------

WEEK = (
    ("Monday", "2025-03-03"),
    ("Tuesday", "2025-03-04"),
    ("Wednesday", "2025-03-05"),
    ("Thursday", "2025-03-06"),
    ("Friday", "2025-03-07"),
)
_PEOPLE = ("Alice", "Bob", "Carol", "Dan", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy")
_TITLES = (
    "Standup",
    "Design review",
    "Budget sync",
    "Hiring panel",
    "Customer call",
    "Roadmap planning",
    "Lunch and learn",
    "Sprint retro",
    "Vendor demo",
    "Security review",
    "Offsite prep",
    "Data sync",
)


def time_alternatives(minutes: int) -> list[str]:
    """Ways to write a time in an answer: 14:00, 2:00 pm, 2 pm, ..."""
    text = format_time(minutes)
    hour, minute = divmod(minutes, 60)
    if hour < 12:
        return [text, text.lstrip("0")]
    twelve = hour - 12 if hour > 12 else 12
    forms = [f"{twelve}:{minute:02d} pm", f"{twelve}:{minute:02d}pm", f"{twelve}:{minute:02d} p.m."]
    forms += [f"{twelve} pm", f"{twelve}pm", f"{twelve} p.m."] if minute == 0 else []
    return [text, *forms]


def _event(rng: random.Random, date: str, start: int, title: str) -> Event:
    people = rng.sample(_PEOPLE, rng.randint(1, 3))
    duration = rng.choice((30, 45, 60))
    return Event(
        id="",
        title=title,
        date=date,
        start=format_time(start),
        duration_minutes=duration,
        attendees=people,
    )


def _fill_day(rng: random.Random, date: str, titles: list[str], start: int = 540) -> list[Event]:
    """Non-overlapping events with the given titles from `start`, separated by random gaps."""
    events, cursor = [], start
    for title in titles:
        cursor += rng.choice((0, 0, 15, 30, 60, 90))
        event = _event(rng, date, cursor, title)
        if cursor + event.duration_minutes > 17 * 60:
            break
        events.append(event)
        cursor += event.duration_minutes
    return events


def _calendar(rng: random.Random, events: list[Event]) -> CalendarState:
    """A state holding `events` with ids evt-1.. in (date, start) order."""
    ordered = sorted(events, key=lambda e: (e.date, e.start))
    numbered = [e.model_copy(update={"id": f"evt-{i}"}) for i, e in enumerate(ordered, start=1)]
    return CalendarState(seed=rng.randrange(2**31), events=numbered, next_id=len(numbered) + 1)


def _other_days(rng: random.Random, skip: str) -> list[Event]:
    events: list[Event] = []
    for _, date in rng.sample([d for d in WEEK if d[1] != skip], 2):
        events += _fill_day(rng, date, rng.sample(_TITLES, rng.randint(1, 3)))
    return events


def _busy_day(rng: random.Random, date: str, titles: list[str], duration: int) -> tuple[CalendarState, int]:
    """A week whose `date` is busy from the morning, and the first free `duration` slot on it."""
    busy = _fill_day(rng, date, titles, start=540 + rng.choice((0, 0, 15)))
    others = _other_days(rng, date)
    state = _calendar(rng, busy + others)
    while (slot := free_slot(state, date, duration)) is None:  # packed: drop the last event
        busy.pop()
        state = _calendar(rng, busy + others)
    return state, slot


def book_first_free(rng: random.Random) -> Scenario:
    """Book a meeting with someone in the first free slot of a day."""
    weekday, date = rng.choice(WEEK[1:])
    duration, person = rng.choice((30, 45, 60)), rng.choice(_PEOPLE)
    titles = rng.sample(_TITLES, 5)
    state, slot = _busy_day(rng, date, titles[:4], duration)
    title, start = f"{titles[4]} with {person}", format_time(slot)
    booked = {"date": date, "start": start, "duration_minutes": duration, "attendees": [person]}
    return Scenario(
        toolset="calendar",
        template="cal_book_first_free",
        prompt=(
            f'Book a {duration}-minute meeting titled "{title}" with {person} in the first free '
            f"slot on {weekday} ({date}), and tell me when it starts."
        ),
        initial_state=state.model_dump(mode="json"),
        success=[
            expect(["events"], "contains", booked, "meeting booked at the slot"),
            expect(["events"], "length", len(state.events) + 1, "one event added"),
        ],
        checkpoints=[
            Checkpoint(
                id="checked_schedule",
                description=f"find_free_slot or list_events on {date} before create_event",
                calls=[called("find_free_slot", date=date), called("list_events", date=date)],
                before=called("create_event"),
            ),
            Checkpoint(id="duration", calls=[called("create_event", duration_minutes=duration)]),
            Checkpoint(id="attendee", calls=[called("create_event", attendees=[person])]),
        ],
        answer=[time_alternatives(slot)],
        reference_turns=[
            [ref_call("find_free_slot", date=date, duration_minutes=duration)],
            [ref_call("create_event", title=title, **booked)],
        ],
        reference_answer=f'Booked "{title}" on {weekday} {date} at {start}.',
    )


def _others_that_day(state: CalendarState, date: str, target: Event) -> list[str]:
    """People on the day's other meetings but not invited to `target`: an answer naming one of them besides the
    invitees is a hedge, not the list asked for."""
    others = {person for event in day_events(state, date) if event.id != target.id for person in event.attendees}
    return sorted(others - set(target.attendees))


def cancel_meeting(rng: random.Random) -> Scenario:
    """Cancel a meeting by title and report its attendees."""
    weekday, date = rng.choice(WEEK)
    day = _fill_day(rng, date, rng.sample(_TITLES, 4))
    state = _calendar(rng, day + _other_days(rng, date))
    target = rng.choice(day_events(state, date))
    remaining = [e.model_dump(mode="json") for e in state.events if e.id != target.id]
    return Scenario(
        toolset="calendar",
        template="cal_cancel_meeting",
        prompt=(f'Cancel my "{target.title}" meeting on {weekday} ({date}) and tell me who was invited.'),
        initial_state=state.model_dump(mode="json"),
        success=[expect(["events"], "equals", remaining, "only that event removed")],
        checkpoints=[
            Checkpoint(
                id="looked_up",
                description=f"list_events on {date} before delete_event",
                calls=[called("list_events", date=date)],
                before=called("delete_event"),
            ),
            Checkpoint(id="deleted_target", calls=[called("delete_event", event_id=target.id)]),
        ],
        answer=[[person] for person in target.attendees],
        wrong_answers=_others_that_day(state, date, target),
        reference_turns=[
            [ref_call("list_events", date=date)],
            [ref_call("delete_event", event_id=target.id)],
        ],
        reference_answer=f'Cancelled "{target.title}". Invited: {", ".join(target.attendees)}.',
    )


def _free_starts(state: CalendarState, date: str, duration: int) -> list[int]:
    """Half-hour starts on `date` where `duration` minutes fit without any overlap."""
    end = parse_time(state.day_end) - duration
    return [m for m in range(540, end + 1, 30) if _conflict(state, date, m, duration) is None]


def reschedule(rng: random.Random) -> Scenario:
    """Move a meeting to a free time on the same day (delete + create)."""
    weekday, date = rng.choice(WEEK)
    day = _fill_day(rng, date, rng.sample(_TITLES, 2))  # ends by 14:00: free time remains
    state = _calendar(rng, day + _other_days(rng, date))
    target = rng.choice(day_events(state, date))
    new_start = format_time(rng.choice(_free_starts(state, date, target.duration_minutes)))
    moved = target.model_dump(exclude={"id", "attendees"}) | {"start": new_start}
    return Scenario(
        toolset="calendar",
        template="cal_reschedule",
        prompt=(
            f'Move my "{target.title}" meeting on {weekday} ({date}) to {new_start} the same '
            "day, keeping its length and attendees."
        ),
        initial_state=state.model_dump(mode="json"),
        success=[
            expect(["events"], "contains", {**moved, "attendees": target.attendees}, "moved"),
            expect(["events"], "not_contains", {"id": target.id}, "old event removed"),
            expect(["events"], "length", len(state.events), "no other change"),
        ],
        checkpoints=[
            Checkpoint(id="looked_up", calls=[called("list_events", date=date)]),
            Checkpoint(id="created_new", calls=[called("create_event", **moved)]),
            Checkpoint(id="deleted_old", calls=[called("delete_event", event_id=target.id)]),
        ],
        reference_turns=[
            [ref_call("list_events", date=date)],
            [
                ref_call("create_event", **moved, attendees=target.attendees),
                ref_call("delete_event", event_id=target.id),
            ],
        ],
        reference_answer=f'"{target.title}" now starts at {new_start} on {weekday}.',
    )


TEMPLATES = {
    "cal_book_first_free": book_first_free,
    "cal_cancel_meeting": cancel_meeting,
    "cal_reschedule": reschedule,
}
