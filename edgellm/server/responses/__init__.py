"""OpenAI's Responses API (/v1/responses) on the shared front-end."""
