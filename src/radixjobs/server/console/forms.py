"""Reading the console's forms: urlencoded, bounded in size and in fields."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request

MAX_FORM_BYTES = 16_384


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form of at most MAX_FORM_BYTES (more, or another encoding: an empty form)."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=20)
    except ValueError:  # too many fields
        return {}
    return {k: v[0] for k, v in fields.items()}
