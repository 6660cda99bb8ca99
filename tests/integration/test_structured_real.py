"""structured_call against the real llama-server: the JSON keys come in the schema's order."""

from __future__ import annotations

import httpx
import orjson
from pydantic import BaseModel, Field

from boundedcode_gateway.client import structured_call
from tests.e2e.conftest import Gateway


class Ticket(BaseModel):
    """Five fields in an order that is not alphabetical."""

    title: str = Field(max_length=40)
    severity: int = Field(ge=1, le=5)
    area: str = Field(max_length=20)
    blocking: bool
    assignee: str = Field(max_length=20)


def test_fields_come_in_declaration_order(real: Gateway) -> None:
    messages = [
        {
            "role": "user",
            "content": (
                "File a ticket as JSON with, in this order: title, severity (1-5), area, "
                "blocking (true/false), assignee. The login page crashes."
            ),
        }
    ]
    ticket = structured_call(
        real.url + "/v1",
        "smol",
        messages,
        Ticket,
        purpose="contract",
        task="structured-real",
        max_tokens=200,
        temperature=0.0,
    )
    assert isinstance(ticket, Ticket)
    call = next(c for c in real.calls() if c["task"] == "structured-real")
    assert call["structured_output"] == "sent" and call["schema_valid"] is True
    assert call["purpose"] == "contract"
    # the raw reply's keys, in order, as the model wrote them under the grammar
    raw = httpx.post(
        real.url + "/v1/chat/completions",
        timeout=60,
        json={
            "model": "smol",
            "messages": messages,
            "max_tokens": 200,
            "temperature": 0.0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "Ticket", "schema": Ticket.model_json_schema()},
            },
        },
    ).json()
    text = raw["choices"][0]["message"]["content"]
    assert list(orjson.loads(text)) == ["title", "severity", "area", "blocking", "assignee"]
