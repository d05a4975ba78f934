"""The fields of a new key, validated the same way for `keys create` and `POST /admin/keys`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tokenrelay.auth.keystore import KeySpec
from tokenrelay.store.timeutil import parse_expiry, utcnow

PositiveLimit = Annotated[int, Field(ge=1)]


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:\-]*$")]
    models: list[Annotated[str, Field(min_length=1)]] | None = None
    rpm: PositiveLimit | None = None
    tpm: PositiveLimit | None = None
    budget_tokens: Annotated[int, Field(ge=0)] | None = None
    expires: str | None = Field(default=None, description="30d, 12h, 2w ... from now, or an ISO date / date-time")
    admin: bool = False

    @field_validator("models")
    @classmethod
    def _some_models(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("models must list at least one model id (leave it out for every model)")
        return value

    @field_validator("expires")
    @classmethod
    def _valid_expiry(cls, value: str | None) -> str | None:
        if value is not None and parse_expiry(value) <= utcnow():
            raise ValueError("expires must be in the future")
        return value

    def spec(self) -> KeySpec:
        return KeySpec(
            name=self.name,
            models=sorted(set(self.models)) if self.models is not None else None,
            rpm=self.rpm,
            tpm=self.tpm,
            budget_tokens=self.budget_tokens,
            expires_at=parse_expiry(self.expires) if self.expires is not None else None,
            admin=self.admin,
        )
