"""`edgellm serve --replicas N|auto`: the model served by N engine replicas behind one Ray Serve ingress
(the optional `edgellm[ray]` extra). ray_run.py starts Ray and deploys ray_app.py's application;
ray_router.py is its request router, on the Ray-free prefix affinity of prefix_router.py; asgi_relay.py
carries HTTP to a replica's ordinary server app as ASGI messages, and replica_metrics.py merges the
replicas' /metrics pages. Only ray_app.py, ray_router.py and ray_run.py import Ray."""
