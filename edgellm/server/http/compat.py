"""What OpenAI clients expect of a server beyond the request bodies: which model names it answers to,
routes with and without the `/v1` prefix, and CORS for browser front-ends."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute, Route

from edgellm.models.catalog import CATALOG
from edgellm.server.http.errors import ApiError

CORS_MAX_AGE_S = 600  # how long a browser may reuse a preflight answer


def default_model_name(model: str) -> str:
    return model if model in CATALOG else Path(model).stem


class ModelNames:
    """The names a single-model server answers to. Without --served-model-name any name is accepted (a
    client configured with a placeholder still works, as with llama-server and Ollama); with it, only
    those names are, and others are 404 as OpenAI answers. Responses always carry `primary`."""

    def __init__(self, model: str, served: Sequence[str] = ()) -> None:
        served = list(dict.fromkeys(served))  # repeated flags: one entry, first one first
        for name in served:
            if not name or name != name.strip():
                raise ValueError(
                    f"--served-model-name {name!r}: expected a non-empty name without outer spaces"
                )
        self.strict = bool(served)
        self.primary = served[0] if served else default_model_name(model)
        self.listed = served or [self.primary]  # what /v1/models lists

    def check(self, name: str | None) -> None:
        if name is not None and self.strict and name not in self.listed:
            raise ApiError(
                404,
                f"The model '{name}' does not exist; this server serves {', '.join(map(repr, self.listed))}",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )


def with_unprefixed(routes: list[BaseRoute]) -> list[BaseRoute]:
    """Every `/v1/...` route also without the prefix (`/chat/completions`), as llama-server serves them,
    except where a route already has that path: llama-server's `/completions` is its own `/completion`,
    not the OpenAI one."""
    taken = {(r.path, m) for r in routes if isinstance(r, Route) for m in r.methods or ()}
    extra: list[BaseRoute] = []
    for r in routes:
        if (
            isinstance(r, Route)
            and r.path.startswith("/v1/")
            and not any((r.path[3:], m) in taken for m in r.methods or ())
        ):
            extra.append(Route(r.path[3:], r.endpoint, methods=r.methods, name=None))
    return routes + extra


def cors_middleware(origins: Sequence[str]) -> list[Middleware]:
    """CORS for the given origins ("*": any); none: no CORS headers and no preflight answers (the
    default: a browser page from another origin cannot call the server)."""
    if not origins:
        return []
    for o in origins:
        if o != "*" and not o.startswith(("http://", "https://")):
            raise ValueError(f"--cors-origin {o!r}: expected '*' or an origin like http://localhost:3000")
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=[o.rstrip("/") for o in origins],
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],  # Authorization and Content-Type, and what client SDKs add (x-stainless-*)
            max_age=CORS_MAX_AGE_S,
        )
    ]
