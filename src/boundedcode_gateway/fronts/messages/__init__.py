"""Anthropic's Messages API as a front (``POST /v1/messages``): its requests made
chat-completions bodies (``request.py``), the answers (``response.py``), the streams
(``stream.py``) and the errors (``errors.py``) written back in its shape; ``front.py``
joins them to the ``Front`` protocol. docs/fronts.md says what is taken and refused.
"""

from boundedcode_gateway.fronts.messages.front import MessagesCountFront, MessagesFront

__all__ = ["MessagesCountFront", "MessagesFront"]
