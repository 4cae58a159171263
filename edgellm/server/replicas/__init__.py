"""`edgellm serve --replicas N|auto`: the model served by N engine replicas behind one Ray Serve ingress
(the optional `edgellm[ray]` extra). server/replicas/launch.py starts Ray and deploys
server/replicas/serve_app.py's application; server/replicas/request_router.py is its request router, on the
Ray-free prefix affinity of prefix_router.py; asgi_relay.py carries HTTP to a replica's ordinary server app as
ASGI messages, and replica_metrics.py merges the replicas' /metrics pages. Only server/replicas/serve_app.py,
server/replicas/request_router.py and server/replicas/launch.py import Ray."""
