"""Request and response models of the HTTP API (FastAPI renders them in the OpenAPI docs at /docs).

Requests are strict: unknown fields, wrong JSON types (``"5"`` for ``top_k``), empty or
whitespace-only queries, over-long ones, and text that is not valid Unicode are rejected with a
JSON error (see :mod:`.errors`) before any model sees them. The last needs no validator here: a
lone surrogate such as ``"\\ud800"`` is valid JSON, but pydantic-core's ``str`` validation
rejects it (``string_unicode``), which the tests check.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

MAX_QUERY_CHARS = 2000
MAX_TOP_K = 50
MAX_HISTORY = 20

Turn = Annotated[str, StringConstraints(max_length=MAX_QUERY_CHARS)]


class SelectRequest(BaseModel):
    """``POST /v1/select``: which tool (if any) does this request need?"""

    model_config = ConfigDict(extra="forbid", strict=True)

    query: str = Field(max_length=MAX_QUERY_CHARS, description="The user's request.")
    top_k: int = Field(default=5, ge=1, le=MAX_TOP_K, description="Candidates to retrieve.")
    history: list[Turn] = Field(
        default_factory=list, max_length=MAX_HISTORY, description="Earlier turns, oldest first."
    )
    needs_tool_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Probability above which a tool is needed (server default)."
    )

    @field_validator("query")
    @classmethod
    def not_blank(cls, value: str) -> str:
        """Whitespace carries no request; it would only reach the models as noise."""
        if not value.strip():
            raise ValueError("query must contain non-whitespace characters")
        return value


class ToolHit(BaseModel):
    """One retrieved candidate."""

    id: str
    name: str
    score: float


class ToolCall(BaseModel):
    """The selector's choice among the candidates, with arguments filled from the tool's schema."""

    tool: str
    arguments: dict[str, Any]


class Versions(BaseModel):
    """The artifact version of each model that answered this request.

    Detector and Retriever are separate deployments: during a rolling hot-swap one may already run
    the new version while the other still runs the old one, and a pinned ``detector_artifact``
    keeps them apart for good.
    """

    detector: str = Field(description="The Detector's version that scored the request.")
    retriever: str | None = Field(
        None, description="The Retriever's version that ranked the tools; null when no tool was needed."
    )


class SelectResponse(BaseModel):
    """The answer: whether a tool is needed, the ranking, the call, and which model versions answered."""

    needs_tool: bool
    probability: float
    tools: list[ToolHit]
    call: ToolCall | None = None
    model_version: str = Field(
        description="The Retriever's version (the Detector's when no tool was needed); see ``versions``."
    )
    versions: Versions
    timings_ms: dict[str, float]


class ToolsInfo(BaseModel):
    """``GET /v1/tools``: the catalog the retriever serves."""

    size: int = Field(description="Tools an answer can name: the model's, less those the catalog retired.")
    model_version: str
    catalog_version: str


class Health(BaseModel):
    status: str


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    """Every error the API returns has this shape."""

    error: ErrorDetail


# The error answers the routes document in the OpenAPI schema (bodies: :class:`ErrorResponse`).
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "Body is not JSON",
        401: "API key missing or wrong",
        413: "Body larger than 1 MiB",
        415: "Content-Type is missing or not application/json",
        422: "Request does not match the schema",
        500: "Unexpected server error (details are in the server log)",
        503: "A model deployment is unavailable",
    }.items()
}
