"""A small client for Kafka Connect's REST API, turning transport failures into one-line errors."""

from __future__ import annotations

from typing import Any

import httpx

from services.stack.service import StackError


class ConnectError(StackError):
    """Kafka Connect is unreachable or refused a request; the message says which and what to do."""


class ConnectApi:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url
        self._client = httpx.Client(base_url=base_url, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ConnectApi:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ConnectError(
                f"cannot reach Kafka Connect at {self.base_url} ({exc.__class__.__name__}): "
                "is the stack up? (`tide stack up`)"
            ) from exc

    def _json(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        if response.status_code not in ok:
            raise ConnectError(f"Kafka Connect {method} {path} answered {response.status_code}: {_message(response)}")
        return response.json() if response.content else None

    def ping(self) -> dict[str, Any]:
        return self._json("GET", "/")

    def validate(self, connector_class: str, config: dict[str, str]) -> list[str]:
        """Connect's own validation of a config; returns one message per invalid setting."""
        plugin = connector_class.rsplit(".", 1)[-1]
        result = self._json("PUT", f"/connector-plugins/{plugin}/config/validate", json=config)
        return [
            f"{item['value']['name']}: {'; '.join(item['value']['errors'])}"
            for item in result["configs"]
            if item["value"]["errors"]
        ]

    def put_config(self, name: str, config: dict[str, str]) -> dict[str, Any]:
        """Create or update (idempotent): the same config twice is a no-op for Connect."""
        return self._json("PUT", f"/connectors/{name}/config", ok=(200, 201), json=config)

    def status(self, name: str) -> dict[str, Any] | None:
        response = self._request("GET", f"/connectors/{name}/status")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ConnectError(f"Kafka Connect status of {name} answered {response.status_code}: {_message(response)}")
        return response.json()

    def offsets(self, name: str) -> list[dict[str, Any]]:
        """The source offsets Connect stores for a registered connector (where it resumes); [] if none."""
        response = self._request("GET", f"/connectors/{name}/offsets")
        if response.status_code == 404:
            return []
        if response.status_code != 200:
            raise ConnectError(f"Kafka Connect offsets of {name} answered {response.status_code}: {_message(response)}")
        return response.json().get("offsets", [])

    def restart(self, name: str) -> None:
        self._json("POST", f"/connectors/{name}/restart", ok=(200, 202, 204), params={"includeTasks": "true"})

    def pause(self, name: str) -> None:
        """Pause the connector's tasks: nothing is read from the slot (it holds the WAL) until resume."""
        self._json("PUT", f"/connectors/{name}/pause", ok=(200, 202, 204))

    def resume(self, name: str) -> None:
        self._json("PUT", f"/connectors/{name}/resume", ok=(200, 202, 204))

    def stop(self, name: str) -> None:
        """Stop the connector and its tasks but keep it registered (needed before resetting offsets)."""
        self._json("PUT", f"/connectors/{name}/stop", ok=(200, 202, 204))

    def reset_offsets(self, name: str) -> None:
        """Forget the source offsets (the LSN the connector resumes from); the connector must be stopped."""
        self._json("DELETE", f"/connectors/{name}/offsets", ok=(200, 202, 204))

    def delete(self, name: str) -> bool:
        response = self._request("DELETE", f"/connectors/{name}")
        if response.status_code == 404:
            return False
        if response.status_code not in (200, 204):
            raise ConnectError(f"Kafka Connect DELETE {name} answered {response.status_code}: {_message(response)}")
        return True


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))[:300]
    except ValueError:
        return response.text[:300]
