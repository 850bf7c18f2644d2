"""Operating figures of the pipeline (docs/status.md): `tide status`, `tide jobs status`, `GET /status`,
`GET /metrics` and the dashboard all show one `Status`, read from the real systems by `collect`."""
