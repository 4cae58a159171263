"""The HTTP layer every API of the server shares: the API-key rule (auth.py), strict parsing
(strict.py), the route wrapper (endpoint.py), errors (errors.py), client compatibility
(compat.py) and the middleware stack (stack.py)."""
