"""Who is calling: the ``Authorization`` header → a ``Caller``, or a 401.

Built from ``auth:`` at start and on each reload (the keys' digests, the token
secrets read then: access/token_secret.py) and asked once per request. A refusal
never repeats the credential it was given.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable

from boundedcode_gateway.access.keys import KeyRing
from boundedcode_gateway.access.token_secret import TokenSecrets
from boundedcode_gateway.access.tokens import is_token, verify_task_token
from boundedcode_gateway.call_context import Caller
from boundedcode_gateway.config import AuthSettings
from boundedcode_gateway.errors import Forbidden, Unauthenticated

BEARER = "bearer "
BASIC = "basic "
# what a browser shows when it asks for the page of calls' credential
BASIC_CHALLENGE = 'Basic realm="BoundedCode gateway", charset="UTF-8"'


class Authenticator:
    """The configured keys and token secrets; ``caller()`` per request."""

    __slots__ = ("_clock", "_keys", "_max_ttl_s", "_secrets")

    def __init__(
        self,
        auth: AuthSettings,
        secrets: TokenSecrets | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = KeyRing(auth.keys)
        # None: this gateway takes no tokens
        self._secrets = secrets.verifying if secrets is not None else None
        self._max_ttl_s = auth.max_token_ttl_s
        self._clock = clock

    def caller(self, authorization: str | None) -> Caller:
        """The caller a ``Bearer`` credential stands for, or ``Unauthenticated``."""
        try:
            return self._caller(authorization)
        except Unauthenticated as exc:
            # RFC 6750: a 401 names the scheme the client should use
            exc.headers["WWW-Authenticate"] = "Bearer"
            raise

    def viewer(self, authorization: str | None) -> Caller:
        """The caller of a page a browser opens: a Bearer credential, or a key given as the
        password of HTTP Basic (any user name), which a browser asks for on a 401 naming
        Basic and then sends with every request of the page, its event stream included."""
        try:
            if authorization is not None and authorization[: len(BASIC)].lower() == BASIC:
                # a Basic credential it cannot read is asked for again, as a wrong one is
                authorization = BEARER + _basic_password(authorization[len(BASIC) :])
            return self._caller(authorization)
        except Unauthenticated as exc:
            exc.headers["WWW-Authenticate"] = BASIC_CHALLENGE
            raise

    def _caller(self, authorization: str | None) -> Caller:
        if authorization is None:
            raise Unauthenticated(
                "No API key given: send it as 'Authorization: Bearer <key>' (the api_key of "
                "the OpenAI SDK or LiteLLM)"
            )
        if authorization[: len(BEARER)].lower() != BEARER:
            raise Unauthenticated("The Authorization header must be 'Bearer <key>'")
        credential = authorization[len(BEARER) :].strip()
        if is_token(credential):
            if self._secrets is None:
                raise Unauthenticated("This gateway does not accept task tokens")
            claims = verify_task_token(self._secrets, credential, self._clock(), self._max_ttl_s)
            return claims.caller()
        caller = self._keys.find(credential)
        if caller is None:
            raise Unauthenticated("Invalid API key")
        return caller


def _basic_password(credential: str) -> str:
    try:
        decoded = base64.b64decode(credential.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        # ValueError: a value outside ASCII (the header is read as latin-1), which
        # b64decode refuses before it decodes anything; UnicodeDecodeError is one too
        raise Unauthenticated("The Basic credential is not valid base64 of 'user:key'") from None
    _user, colon, password = decoded.partition(":")
    if not colon or not password:
        raise Unauthenticated("Give the admin key as the password (any user name)")
    return password


def check_model(caller: Caller, model: str) -> None:
    """A 403 when the caller's credential does not list ``model``."""
    if not caller.may_use(model):
        raise Forbidden(
            f"The caller '{caller.name}' may not use the model '{model}'",
            param="model",
            code="model_not_allowed",
        )


def metered_task(caller: Caller, task: str | None) -> str | None:
    """The task a call is metered under: a token's own when the request names none.

    A token used for a task other than its own is a 403.
    """
    if caller.task is None:
        return task
    if task is not None and task != caller.task:
        raise Forbidden(
            f"The task token is for task '{caller.task}', not '{task}'",
            param="X-BoundedCode-Task",
            code="task_mismatch",
        )
    return caller.task
