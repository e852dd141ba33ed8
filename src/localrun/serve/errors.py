"""The HTTP layer's refusals: `ApiError`, a status with its message, the field at fault and a code; each dialect
shapes it into its own error body."""

from __future__ import annotations

from typing import Optional


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.sizes: Optional[tuple[int, int]] = None  # a context overflow's (prompt tokens, context tokens)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
