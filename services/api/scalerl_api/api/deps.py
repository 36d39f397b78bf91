"""Request dependencies: the DB session, bearer-token auth, the backends the routes talk to."""

from __future__ import annotations

import secrets
from typing import Annotated, Iterator

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from scalerl_api.backends import Backends

bearer = HTTPBearer(auto_error=False)


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.sessionmaker() as session:
        yield session


def require_token(request: Request,
                  credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    expected = request.app.state.settings.api_token
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})


def get_backends(request: Request) -> Backends:
    return request.app.state.backends


SessionDep = Annotated[Session, Depends(get_db)]
BackendsDep = Annotated[Backends, Depends(get_backends)]
