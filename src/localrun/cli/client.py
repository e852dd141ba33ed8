"""A small HTTP client for the server's own endpoints (ps, stop), on the standard library: the CLI's
client path imports neither the server stack nor httpx."""

from __future__ import annotations

import http.client
import json
from typing import Any, Optional

from ..errors import LocalrunError


class Client:
    def __init__(self, host: str, port: int, api_key: Optional[str] = None, timeout: float = 30.0):
        self.host, self.port, self.api_key, self.timeout = host, port, api_key, timeout

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    def get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict) -> Any:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: Optional[dict]) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except ConnectionRefusedError:
            raise LocalrunError(f"no localrun server at {self.address}: start one with `localrun serve`") from None
        except OSError as exc:
            raise LocalrunError(f"cannot reach the server at {self.address}: {exc.strerror or exc}") from None
        finally:
            conn.close()
        try:
            data = json.loads(raw)
        except ValueError:
            raise LocalrunError(f"{self.address} did not answer as a localrun server (HTTP {response.status})") from None
        if response.status >= 400:
            message = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
            raise LocalrunError(f"the server at {self.address} answered {response.status}: {message or raw[:200]!r}")
        return data
