"""OpenAI's Responses API as a front (front.py joins the pure translation modules)."""

from boundedcode_gateway.fronts.responses.front import ResponsesFront

__all__ = ["ResponsesFront"]
