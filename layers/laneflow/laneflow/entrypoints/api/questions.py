"""The API's routes for questions steps put to people (their `ask` tool): the questions
waiting now, and answering one. On the same resolver as every route (`routes.app`)."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from laneflow.domain.inbox import MAX_NOTE_CHARS
from laneflow.entrypoints.api.routes import RunId, Svc, Tenant, _errors, app
from laneflow.usecases.answer import answer_question, waiting_questions

StepIndex = Annotated[int, Path(description="the step's index in the run", ge=0, le=10_000_000)]


class AnswerBody(BaseModel):
    """A person's answer to the question a step is waiting on."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr = Field(min_length=1, max_length=MAX_NOTE_CHARS, description="the answer, as the step will read it")


class Answered(BaseModel):
    run_id: str
    index: int = Field(description="the step that asked")
    question: str
    answer: str
    answered_at: str


class Question(BaseModel):
    run_id: str
    index: int = Field(description="the step waiting on it")
    agent: str | None
    question: str
    asked_at: str
    answer_at: str = Field(description="where to POST the answer")


class QuestionList(BaseModel):
    questions: list[Question] = Field(description="the questions steps are waiting on now, oldest first")


@app.post(
    "/runs/<run_id>/steps/<index>/answer",
    summary="Answer the question a step is waiting on (its ask tool)",
    tags=["runs"],
    responses={
        200: {
            "description": "the question, answered: the step goes on with it",
            "content": {"application/json": {"model": Answered}},
        },
        **_errors(400, 401, 404, 409),
    },
)
def answer(run_id: RunId, index: StepIndex, body: Annotated[AnswerBody, Body()], tenant: Tenant, svc: Svc) -> dict[str, Any]:
    note = answer_question(svc, tenant, run_id, index, body.text)
    return {
        "run_id": note.run_id,
        "index": note.to_index,
        "question": note.text,
        "answer": note.answer,
        "answered_at": note.answered_at,
    }


@app.get(
    "/questions",
    summary="The questions steps are waiting on, oldest first",
    tags=["runs"],
    responses={
        200: {"description": "the caller's waiting questions", "content": {"application/json": {"model": QuestionList}}},
        **_errors(400, 401),
    },
)
def questions(
    tenant: Tenant,
    svc: Svc,
    run: Annotated[str | None, Query(min_length=1, max_length=128, description="only this run's")] = None,
) -> dict[str, Any]:
    found = waiting_questions(svc, tenant, run_id=run)
    return {
        "questions": [
            {
                "run_id": q.run_id,
                "index": q.index,
                "agent": q.agent,
                "question": q.question,
                "asked_at": q.asked_at,
                "answer_at": f"/runs/{q.run_id}/steps/{q.index}/answer",
            }
            for q in found
        ]
    }
