"""The ASGI primitives every HTTP surface uses: answers written to ``send``, request bodies
read and parsed within their limits. It knows no route, front, caller or upstream."""
