"""Schedule routes (admin): define, list, read, delete, pause and resume the cron schedules that enqueue
jobs. A key limited to some queues sees and changes the schedules of those queues only; others are 404.
It creates schedules only under names that match its queue patterns (a PUT of another name that is not
one of its schedules is 403, whether or not some other queue's schedule has it)."""

from typing import Annotated

from fastapi import FastAPI, Path, Request
from fastapi.responses import Response

from app.auth.policy import authorize, principal, requires
from app.core.schedules import ScheduleService
from app.http.documents import schedule_document
from app.http.jobs import _problems
from app.http.responses import json_response
from app.models.fields import QUEUE_PATTERN
from app.models.schedules import Schedule, ScheduleList, ScheduleRequest
from app.services import services

ScheduleName = Annotated[str, Path(pattern=QUEUE_PATTERN, description="The schedule's name: `[A-Za-z0-9_.:-]{1,128}`.")]

_PUT = (
    "Creates the schedule (201) or replaces it (200). From then on, each tick of `cron` in `timezone`, by the "
    "database clock, enqueues one job with `payload`, `priority` and `max_attempts` on `queue`, whatever the "
    "number of replicas; the job shows `schedule` and `scheduled_for` (the tick). Replacing keeps the next "
    "tick when `cron` and `timezone` are unchanged (applying the same definition again neither skips nor "
    "repeats a tick), and keeps the paused state unless `paused` is given. A bad `cron` or `timezone` is 422 "
    "with what is wrong. A key limited to some queues creates schedules only under names matching its queue "
    "patterns (403 otherwise); 409 `schedule-name-taken`: a schedule of a queue the key may not use has the "
    "name; 409 `too-many-schedules`: JOBQ_MAX_SCHEDULES schedules exist."
)

_PUT_409 = (
    "`schedule-name-taken`: a schedule of a queue this key may not use has this name. `too-many-schedules`: "
    "JOBQ_MAX_SCHEDULES schedules exist; delete one first."
)


def schedules(request: Request) -> ScheduleService:
    return services(request).schedules


def add_schedule_routes(api: FastAPI) -> None:
    @api.get(
        "/schedules",
        operation_id="listSchedules",
        summary="Every schedule, with its next run",
        tags=["schedules"],
        response_model=ScheduleList,
        description="With a key limited to some queues, the schedules of those queues only.",
        responses=_problems(401, 403, 503),
    )
    @requires("admin")
    async def list_schedules(request: Request) -> Response:
        rows = await schedules(request).list(principal(request).queue_regex)
        return json_response({"schedules": [schedule_document(r) for r in rows]})

    @api.put(
        "/schedules/{name}",
        operation_id="putSchedule",
        summary="Create or replace a schedule",
        description=_PUT,
        tags=["schedules"],
        status_code=200,
        response_model=Schedule,
        responses={
            201: {"model": Schedule, "description": "Created."},
            **_problems(400, 401, 403, 409, 413, 415, 422, 503, conflict=_PUT_409),
        },
    )
    @requires("admin")
    async def put_schedule(name: ScheduleName, body: ScheduleRequest, request: Request) -> Response:
        who = principal(request)
        authorize(who, "admin", body.queue)
        # A key limited to some queues creates schedules only under names that match its patterns: were any
        # name open to it, a name held by another tenant's schedule would answer otherwise than a free one.
        may_create = who.queue_regex is None or who.allows(name)
        stored = await schedules(request).put(name, body, who.queue_regex, may_create)
        return json_response(schedule_document(stored.schedule), 201 if stored.created else 200)

    @api.get(
        "/schedules/{name}",
        operation_id="getSchedule",
        summary="Get a schedule and its next run",
        tags=["schedules"],
        response_model=Schedule,
        responses=_problems(401, 403, 404, 422, 503),
    )
    @requires("admin")
    async def get_schedule(name: ScheduleName, request: Request) -> Response:
        return json_response(schedule_document(await schedules(request).get(name, principal(request).queue_regex)))

    @api.delete(
        "/schedules/{name}",
        operation_id="deleteSchedule",
        summary="Delete a schedule",
        description="No more jobs are enqueued for it; the jobs it made stay as they are.",
        tags=["schedules"],
        status_code=204,
        response_class=Response,
        responses=_problems(401, 403, 404, 422, 503),
    )
    @requires("admin")
    async def delete_schedule(name: ScheduleName, request: Request) -> Response:
        await schedules(request).delete(name, principal(request).queue_regex)
        return Response(status_code=204)

    @api.post(
        "/schedules/{name}/pause",
        operation_id="pauseSchedule",
        summary="Pause a schedule: no jobs until it is resumed",
        tags=["schedules"],
        response_model=Schedule,
        responses=_problems(401, 403, 404, 415, 422, 503),
    )
    @requires("admin")
    async def pause_schedule(name: ScheduleName, request: Request) -> Response:
        return json_response(schedule_document(await schedules(request).pause(name, principal(request).queue_regex)))

    @api.post(
        "/schedules/{name}/resume",
        operation_id="resumeSchedule",
        summary="Resume a paused schedule from its next tick after now",
        description="The ticks that came while it was paused are not enqueued. Resuming a running schedule "
        "changes nothing.",
        tags=["schedules"],
        response_model=Schedule,
        responses=_problems(401, 403, 404, 415, 422, 503),
    )
    @requires("admin")
    async def resume_schedule(name: ScheduleName, request: Request) -> Response:
        return json_response(schedule_document(await schedules(request).resume(name, principal(request).queue_regex)))
