"""Anthropic's Messages API (/v1/messages) on the shared front-end."""
