"""The HTTP layer: routes, the lean dispatcher for hot routes, problem responses, OpenAPI, the dashboard."""
